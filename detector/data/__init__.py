"""Datasets: YAML specs, label formats, augmentation, loaders and the built-in synthetic set."""
