"""What the Ultralytics oracles' child processes share (tests/weights/test_yolo11_import.py, test_yolo26_import.py):
Python source prepended to each one's own script, run as ``python -c SCRIPT OUT``. It defines how a network's
statistics are made lively, the two ways Ultralytics 8.4 saves a checkpoint, and how the raw head outputs of a saved
file are written; the script itself sets ``out`` (the folder) and ``images`` (the fixed inputs) before calling them.
:func:`run_oracle` runs such a script.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch


def run_oracle(script: str, out: Path) -> Path:
    """Run ``script`` (``python -c SCRIPT OUT``) in a child process writing into ``out``; -> ``out``.

    YOLO_OFFLINE: never reach the network; YOLO_CONFIG_DIR: its settings file goes to the temporary folder;
    OMP_NUM_THREADS: this process's torch threads (1, tests/conftest.py), so that both sides split each
    convolution's sums alike (on another thread count the kernels add them in another order: 1e-5 apart, measured),
    and two threads on the shared 2 cores made a setup ~35 s."""
    env = {**os.environ, "YOLO_OFFLINE": "1", "YOLO_CONFIG_DIR": str(out / "config"),
           "OMP_NUM_THREADS": str(torch.get_num_threads())}
    done = subprocess.run([sys.executable, "-c", script, str(out)], env=env, cwd=out, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out

PRELUDE = r'''
import copy, sys
import torch
from ultralytics import YOLO
from ultralytics.cfg import get_cfg
from ultralytics.nn.tasks import DetectionModel, yaml_model_load


def randomised(network, seed):
    """BN statistics and class biases off their defaults (mean 0, var 1 would hide a swapped or skipped tensor); a
    YOLO26 head's one-to-one branch (at first a copy of the usual one) gets its own, so that a branch read into the
    other's place moves the outputs. The draws of a head without that branch are YOLO11's as they always were."""
    generator = torch.Generator().manual_seed(seed)
    head = network.model[-1]
    with torch.no_grad():
        for module in network.modules():
            if isinstance(module, torch.nn.BatchNorm2d):
                module.weight.uniform_(0.5, 1.5, generator=generator)
                module.bias.normal_(0.0, 0.2, generator=generator)
                module.running_mean.normal_(0.0, 0.2, generator=generator)
                module.running_var.uniform_(0.5, 2.0, generator=generator)
        for branch in (*head.cv3, *(getattr(head, "one2one_cv3", None) or ())):
            branch[-1].bias.normal_(-6.0, 2.0, generator=generator)
        for branch in getattr(head, "one2one_cv2", None) or ():
            branch[-1].weight.mul_(torch.empty_like(branch[-1].weight).uniform_(0.5, 1.5, generator=generator))
    return network


def save_training(network, path):
    """As BaseTrainer.save_model writes a last.pt: FP16 "ema", "model": None, the optimizer's state and the run's
    arguments beside."""
    args = get_cfg()
    network.nc, network.names, network.args = 80, {i: f"class{i}" for i in range(80)}, args
    optimizer = torch.optim.SGD(network.parameters(), lr=0.01, momentum=0.9)
    for parameter in network.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()  # momentum buffers: the optimizer state a last.pt holds
    torch.save({"epoch": 3, "best_fitness": 0.1, "model": None, "ema": copy.deepcopy(network).half(), "updates": 120,
                "optimizer": optimizer.state_dict(), "train_args": vars(args), "version": "8.4"}, path)


def built_and_saved(cases):
    """Each ``(name, seed, layout)``: Ultralytics' model from ``NAME.yaml``, made lively, saved as ``NAME.pt`` as
    released ("release": Model.save, FP16 "model", "ema": None) or as a run's last.pt ("training"), and its raw
    outputs written; -> {name: network}."""
    built = {}
    for name, seed, layout in cases:
        torch.manual_seed(seed)
        wrapper = YOLO(f"{name}.yaml", verbose=False)
        built[name] = randomised(wrapper.model, seed)
        if layout == "release":
            wrapper.save(f"{out}/{name}.pt")
        else:
            save_training(wrapper.model, f"{out}/{name}.pt")
        raw_outputs(f"{out}/{name}.pt", name)
    return built


def fine_tuned(yaml_name, source):
    """A 3-class model fine-tuned from the 80-class ``source``, as Ultralytics 8.4 keeps it (class branches at the
    source's width), made lively and saved as ``fine-tuned.pt``, its raw outputs written."""
    tuned = DetectionModel(yaml_name, nc=3, verbose=False)
    tuned.names = {0: "cat", 1: "dog", 2: "person"}
    tuned.load(source, verbose=False)
    randomised(tuned, 3)
    torch.save({"model": copy.deepcopy(tuned).half(), "ema": None}, f"{out}/fine-tuned.pt")
    raw_outputs(f"{out}/fine-tuned.pt", "fine-tuned")


def raw_outputs(path, name):
    """The raw head outputs of the file as Ultralytics reads it back (so both sides see the same FP16 rounding):
    ``NAME.raw.pt``, or for a two-branch head ``NAME.one2many.pt`` and ``NAME.one2one.pt``; each ``[B, 4*reg_max + nc,
    anchors]`` (its "boxes" then its "scores")."""
    stored = torch.load(path, map_location="cpu", weights_only=False)
    with torch.no_grad():
        _, raw = (stored["ema"] or stored["model"]).float().eval()(images)
    branches = {"raw": raw} if "boxes" in raw else {branch: raw[branch] for branch in ("one2many", "one2one")}
    for branch, maps in branches.items():
        torch.save(torch.cat((maps["boxes"], maps["scores"]), 1), f"{out}/{name}.{branch}.pt")
'''
