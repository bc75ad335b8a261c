"""The inference tests use the nano checkpoint and ONNX export fixtures of tests/conftest.py."""
