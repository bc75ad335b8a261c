"""What each command does, without its command line: ``run_<command>(options)`` with a typed option object.

    options.py    ValOptions, PredictOptions, ExportOptions, BenchmarkOptions, TuneOptions: every command's flags, importing no
                  torch (so ``--help`` is instant); their shared parts live in detector/options.py
    val.py        run_val: score a checkpoint on a dataset split
    predict.py    run_predict: a .pt / .onnx / .engine model over images, folders or videos
    export.py     run_export: checkpoint -> ONNX / TensorRT, behind a parity check
    benchmark.py  run_benchmark: pre-process / inference / post-process time per backend
    tune.py       run_tune: hyperparameter evolution, each iteration a training child (tune_space.py: the search
                  space; tune_mutation.py: the next settings; tune_records.py: what the tune folder holds)

detector/cli parses a command line into these objects; detector/api builds them from keyword arguments.
Training's option object is :class:`detector.training.config.TrainConfig` and its workflow
:func:`detector.training.trainer.train`. Nothing here imports the command line or the API (tests/test_layout.py).
"""
