"""The data path at COCO scale: start-up, cached start-up, time to the first batch, loader-worker memory.

Generates a synthetic COCO-sized set (benchmarks/synthetic_coco.py: 118,287 hard-linked tiny JPEGs, ~7 boxes an
image, a ~430 MB instances JSON, a few bad files) in both layouts, then measures, each in a fresh process:

- the scan (listing, labels, image header checks) on a first run (no cache) and a second (cached): wall time,
  the main process's peak RSS, and the size of the flat records it keeps;
- time to the first training batch, through the trainer's own builders (``build_data``, ``build_train_loader``),
  on a first and a second run;
- each loader worker's memory at the start and after a full pass with ``--workers`` workers (RSS, and PSS and
  private memory from /proc/<pid>/smaps_rollup: RSS counts the parent's shared pages a worker reads, private
  memory is what it copied);
- Ultralytics' dataset build and first batch on the same YOLO files (first run without its ``.cache``, second
  with), when it is installed (a benchmark extra, AGPL-3.0: `pip install ultralytics`; never imported by detector);
- the validation row: one COCO evaluation of 5,000 images x 300 detections (benchmarks/coco_eval_speed.py).

Files stay in the page cache between runs (they were just written): "first run" means no records cache, not a
cold disk. Every cache the runs write stays under ``--root``.

    python benchmarks/data_scale.py --images 5000            # a quick look (~2 minutes on 2 cores)
    python benchmarks/data_scale.py                          # COCO train2017's 118,287 images (~20 minutes on
                                                             # 2 cores, most of it the two full passes)
    python benchmarks/data_scale.py --pass-images 1600       # the same, the worker-memory passes cut short (~4 min)
    python benchmarks/data_scale.py --root /tmp/scale --keep # keep the set, reuse it next time

The set needs ~1 GB of disk at 118k images (the JSON, and one block per label file) and ~0.3 GB more while
it runs (caches); a first COCO-layout run peaks at ~4 GB of RAM (the whole JSON parsed at once).
"""

from __future__ import annotations

import checkout  # noqa: F401 - first: this checkout's detector, installed or not
import argparse
import importlib.metadata
import importlib.util
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from isolated import run_isolated
from synthetic_coco import reuse_or_generate

# Each measurement is one of these scripts, run in a fresh process (benchmarks/isolated.py).
MEMORY = r"""
import os, resource
def cpu_s():
    # User + system seconds of this process and of its children that have ended (the scan's process pool).
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime
def peak_rss_mb():
    # VmHWM, not getrusage's ru_maxrss: Linux carries ru_maxrss across exec, so a child would report the larger
    # of its own peak and its parent's RSS at the fork (the benchmark's, after generating the set).
    with open("/proc/self/status") as file:
        return next(int(line.split()[1]) for line in file if line.startswith("VmHWM:")) / 1024
def memory_mb(pid):
    # /proc/<pid>/smaps_rollup: Rss, Pss (shared pages divided among their sharers), Private_* (this process's own).
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as file:
        for line in file:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1]) / 1024
    return {"rss": fields["Rss"], "pss": fields["Pss"],
            "private": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0)}
"""

SCAN = MEMORY + r"""
import json, sys, time
from detector.data.scan import scan_split
from detector.data.spec import load_dataset_spec
args = json.loads(sys.argv[1])
before_mb, cpu_start = memory_mb(os.getpid())["rss"], cpu_s()
start = time.perf_counter()
spec = load_dataset_spec(args["data"])
listed = time.perf_counter()
result = scan_split(spec.train, spec.names)
done = time.perf_counter()
arrays = result.records.arrays()
print("RESULT", json.dumps({
    "list_s": listed - start, "scan_s": done - listed, "cpu_s": cpu_s() - cpu_start, "before_mb": before_mb,
    "peak_mb": peak_rss_mb(),
    "records_mb": sum(a.nbytes for a in arrays.values()) / 2**20, "images": len(result.records),
    "boxes": int(len(result.records.labels)), "cached": result.cached_images, "problems": result.problems.lines(),
    "cache_file": str(result.cache_file)}))
"""

FIRST_BATCH = MEMORY + r"""
import json, sys, time
import torch
from detector.training.builders import build_data, build_train_loader
from detector.training.config import TrainConfig
from detector.distributed import DistInfo
args = json.loads(sys.argv[1])
before_mb = memory_mb(os.getpid())["rss"]
start = time.perf_counter()
# cache="none": at COCO's 640 px the decoded images (~110 GB) never fit, so `--cache auto` reads from disk there too.
config = TrainConfig(data=args["data"], imgsz=args["imgsz"], batch=args["batch"], workers=args["workers"],
                     cache="none", device="cpu").with_defaults().validate()
device, dist = torch.device("cpu"), DistInfo()
_, train, _ = build_data(config, with_val=False, device=device, dist=dist)
sampler, loader = build_train_loader(train, config, dist, device)
sampler.set_epoch(0, use_mosaic=True)
batches = iter(loader)
next(batches)
first_batch_s = time.perf_counter() - start
out = {"first_batch_s": first_batch_s, "images": len(train.dataset), "before_mb": before_mb,
       "at_batch_mb": memory_mb(os.getpid())["rss"]}
if args["full_pass"]:
    workers = [worker.pid for worker in batches._workers]
    before = [memory_mb(pid) for pid in workers]
    seen, pass_start = args["batch"], time.perf_counter()
    for images, _, _ in batches:
        seen += len(images)
        if args["pass_images"] and seen >= args["pass_images"]:
            break
    after = [memory_mb(pid) for pid in workers]  # persistent workers: still alive after the pass
    out.update({"pass_s": time.perf_counter() - pass_start, "pass_images": seen, "before": before, "after": after,
                "main_rss_mb": memory_mb(os.getpid())["rss"]})
out["peak_mb"] = peak_rss_mb()
print("RESULT", json.dumps(out))
"""

ULTRALYTICS = MEMORY + r"""
import json, sys, time
import yaml
from ultralytics.cfg import get_cfg
from ultralytics.data.build import build_dataloader, build_yolo_dataset
args = json.loads(sys.argv[1])
spec = yaml.safe_load(open(args["data"]))
names = dict(enumerate(spec["names"]))
# The dict check_det_dataset would return, built directly: that function also fetches fonts and downloads.
data = {"path": spec["path"], "train": f"{spec['path']}/{spec['train']}", "val": f"{spec['path']}/{spec['val']}",
        "names": names, "nc": len(names), "channels": 3}
before_mb, cpu_start = memory_mb(os.getpid())["rss"], cpu_s()
start = time.perf_counter()
overrides = {"imgsz": args["imgsz"], "batch": args["batch"], "workers": args["workers"], "task": "detect"}
cfg = get_cfg(overrides=overrides)
dataset = build_yolo_dataset(cfg, data["train"], args["batch"], data, mode="train")
built, build_peak_mb, build_cpu_s = time.perf_counter(), peak_rss_mb(), cpu_s() - cpu_start
loader = build_dataloader(dataset, args["batch"], args["workers"], shuffle=True, pin_memory=False, device="cpu")
next(iter(loader))
print("RESULT", json.dumps({"build_s": built - start, "cpu_s": build_cpu_s,
                            "first_batch_s": time.perf_counter() - start,
                            "images": len(dataset), "before_mb": before_mb, "build_peak_mb": build_peak_mb,
                            "peak_mb": peak_rss_mb(), "at_batch_mb": memory_mb(os.getpid())["rss"],
                            "workers": loader.num_workers}))
"""

EVALUATION = r"""
import json, sys
sys.path.insert(0, "benchmarks")
args = json.loads(sys.argv[1])
import coco_eval_speed
backends = list(getattr(coco_eval_speed, "BACKENDS", ["pycocotools"]))
print("RESULT", json.dumps({backend: coco_eval_speed.time_evaluation(args["images"], args["detections"], backend)
                            for backend in backends}))
"""


def child_env(root: Path) -> dict[str, str]:
    """The children's environment: every cache and settings file under ``root``, Ultralytics offline."""
    home = root / "home"
    env = {**os.environ, "XDG_CACHE_HOME": str(home / "cache"), "YOLO_CONFIG_DIR": str(home / "ultralytics"),
           "YOLO_OFFLINE": "1", "MPLCONFIGDIR": str(home / "matplotlib"), "PYTHONWARNINGS": "ignore"}
    return env


def clear_caches(root: Path) -> None:
    """Remove what earlier runs cached: our records caches and Ultralytics' label caches."""
    for pattern in ("**/*.records.npz", "yolo/labels/*.cache", "home/cache"):
        for path in root.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()


def measure(script: str, payload: dict, env: dict[str, str], what: str) -> dict:
    print(f"  {what} ...", file=sys.stderr, flush=True)
    start = time.perf_counter()
    result = run_isolated(script, payload, env=env)
    result["process_s"] = time.perf_counter() - start  # the whole child, interpreter start and imports included
    return result


def ours(layout: str, data: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, dict]:
    """Scan and first-batch runs of one layout: first (no cache) and second (cached)."""
    batch_payload = {"data": str(data), "imgsz": args.imgsz, "batch": args.batch, "workers": args.workers,
                     "pass_images": args.pass_images}
    runs: dict[str, dict] = {}
    clear_caches(args.root)
    runs["scan first"] = measure(SCAN, {"data": str(data)}, env, f"{layout}: scan, no cache")
    runs["scan second"] = measure(SCAN, {"data": str(data)}, env, f"{layout}: scan, cached")
    clear_caches(args.root)
    runs["batch first"] = measure(FIRST_BATCH, {**batch_payload, "full_pass": False}, env,
                                  f"{layout}: first batch, no cache")
    runs["batch second"] = measure(FIRST_BATCH, {**batch_payload, "full_pass": True}, env,
                                   f"{layout}: first batch, cached, then a full pass with {args.workers} workers")
    return runs


def ultralytics(data: Path, args: argparse.Namespace, env: dict[str, str]) -> dict[str, dict] | str:
    """Ultralytics' build on the YOLO files, or why it was skipped."""
    if args.skip_ultralytics:
        return "skipped (--skip-ultralytics)"
    # Found, not imported: importing it writes its settings file under the user's home (the runs set its folder).
    if importlib.util.find_spec("ultralytics") is None:
        return "skipped: ultralytics is not installed (`pip install ultralytics`, a benchmark extra)"
    payload = {"data": str(data), "imgsz": args.imgsz, "batch": args.batch, "workers": args.workers}
    clear_caches(args.root)
    first = measure(ULTRALYTICS, payload, env, "Ultralytics: build, no .cache")
    second = measure(ULTRALYTICS, payload, env, "Ultralytics: build, cached")
    return {"first": first, "second": second}


def evaluation(args: argparse.Namespace, env: dict[str, str]) -> dict | str:
    if not (Path(__file__).parent / "coco_eval_speed.py").is_file():
        return "skipped: benchmarks/coco_eval_speed.py is not in this checkout"
    try:
        return measure(EVALUATION, {"images": args.eval_images, "detections": 300}, env, "evaluation")
    except RuntimeError as error:
        return f"skipped: benchmarks/coco_eval_speed.py failed ({str(error).strip().splitlines()[-1]})"


def growth(run: dict, key: str) -> float:
    """The largest growth of ``key`` (rss, pss, private) among the workers over the pass."""
    return max(after[key] - before[key] for before, after in zip(run["before"], run["after"]))


def startup_table(results: dict[str, dict], theirs: dict | str) -> list[str]:
    lines = ["| data path | layout | run | listing s | labels + image checks s | CPU s (all processes) | RSS MB "
             "before -> peak (scan process) | records MB | first batch s | RSS MB before / peak / at the first batch "
             "(first-batch process) |", "|---|---|---|---|---|---|---|---|---|---|"]
    for layout, runs in results.items():
        for run in ("first", "second"):
            scan, batch = runs[f"scan {run}"], runs[f"batch {run}"]
            label = "first (no cache)" if run == "first" else f"second ({scan['cached']} cached)"
            lines.append(f"| detector | {layout} | {label} | {scan['list_s']:.1f} | {scan['scan_s']:.1f} | "
                         f"{scan['cpu_s']:.1f} | "
                         f"{scan['before_mb']:.0f} -> {scan['peak_mb']:.0f} | {scan['records_mb']:.1f} | "
                         f"{batch['first_batch_s']:.1f} | {batch['before_mb']:.0f} / {batch['peak_mb']:.0f} / "
                         f"{batch['at_batch_mb']:.0f} |")
    if not isinstance(theirs, dict):
        return [*lines, "", f"Ultralytics: {theirs}"]
    version = importlib.metadata.version("ultralytics")
    for run in ("first", "second"):
        r = theirs[run]
        label = "first (no .cache)" if run == "first" else "second (.cache)"
        lines.append(f"| Ultralytics {version} | yolo | {label} | in the build | {r['build_s']:.1f} (dataset build) | "
                     f"{r['cpu_s']:.1f} | "
                     f"{r['before_mb']:.0f} -> {r['build_peak_mb']:.0f} | - | {r['first_batch_s']:.1f} "
                     f"({r['workers']} workers) | {r['before_mb']:.0f} / {r['peak_mb']:.0f} / {r['at_batch_mb']:.0f} |")
    return lines


def memory_table(results: dict[str, dict]) -> list[str]:
    lines = ["| layout | images in the pass | pass s | worker RSS MB start -> end (the worker that grew most) | "
             "PSS growth MB | private growth MB | main RSS MB after |", "|---|---|---|---|---|---|---|"]
    for layout, runs in results.items():
        r = runs["batch second"]
        worst = max(range(len(r["before"])), key=lambda i: r["after"][i]["rss"] - r["before"][i]["rss"])
        lines.append(f"| {layout} | {r['pass_images']} | {r['pass_s']:.0f} | {r['before'][worst]['rss']:.0f} -> "
                     f"{r['after'][worst]['rss']:.0f} ({growth(r, 'rss'):+.1f}) | {growth(r, 'pss'):+.1f} | "
                     f"{growth(r, 'private'):+.1f} | {r['main_rss_mb']:.0f} |")
    return lines


def print_tables(args: argparse.Namespace, results: dict[str, dict], theirs: dict | str, evaluated: dict | str) -> None:
    print(f"\n{args.images} train images (synthetic, 64x48 JPEGs, ~7.3 boxes each), imgsz {args.imgsz}, batch "
          f"{args.batch}, {args.workers} loader workers, {os.cpu_count()} cores; files warm in the page cache\n")
    print("\n".join(startup_table(results, theirs)))
    print("\nListing: the YAML read and the image folder listed; labels + image checks: scan_split (our scan; the "
          "JSON parse for coco); CPU s: user + system time of listing and scan, every process and thread (the "
          "figure a busy machine changes least); RSS before -> peak: the scan's process after its imports, and its "
          "peak (the parsed records and everything transient); records: the flat arrays it keeps. First batch: the "
          "trainer's build_data + build_train_loader + one batch, in a new process, timed after its imports (torch "
          "and the trainer's modules: most of that process's RSS before).\n")
    print("\n".join(memory_table(results)))
    print("\nWorker memory: each of the workers at its first batch and after the pass (persistent workers); each "
          "growth column is the largest of the workers'. RSS also counts the parent's shared pages a worker has "
          "read; private memory is what it holds alone (pages it copied or allocated).\n")
    if isinstance(evaluated, dict):
        print(f"| validation: {args.eval_images} images x 300 detections | seconds |\n|---|---|")
        for backend, seconds in evaluated.items():
            if backend != "process_s":
                print(f"| {backend} | {seconds:.1f} |")
    else:
        print(f"Validation row: {evaluated}")
    for layout, runs in results.items():
        print(f"\nProblems reported by the first {layout} scan (one line per kind):")
        for line in runs["scan first"]["problems"]:
            print(f"    {line}")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=118_287, help="train images (default: COCO train2017's)")
    parser.add_argument("--root", type=Path, default=None, help="work folder (default: a new one under the temp dir)")
    parser.add_argument("--keep", action="store_true", help="keep the set under --root, and reuse one made there")
    parser.add_argument("--workers", type=int, default=8, help="loader workers")
    parser.add_argument("--imgsz", type=int, default=64, help="training image size (small: pixels are not the point)")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--pass-images", type=int, default=0, help="stop the worker-memory pass after this many "
                                                                    "images (0: a full pass)")
    parser.add_argument("--eval-images", type=int, default=5000, help="images of the validation row")
    parser.add_argument("--layouts", default="yolo,coco", help="comma list of yolo, coco")
    parser.add_argument("--skip-ultralytics", action="store_true")
    args = parser.parse_args(argv)
    layouts = [layout for layout in args.layouts.split(",") if layout]
    if not layouts or set(layouts) - {"yolo", "coco"}:
        parser.error(f"--layouts: choose from yolo, coco (got {args.layouts!r})")
    args.layouts = layouts
    if args.images < 16:
        parser.error("--images must be at least 16")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    created = args.root is None
    args.root = (Path(tempfile.mkdtemp(prefix="data_scale_")) if created else args.root).resolve()
    args.root.mkdir(parents=True, exist_ok=True)
    try:
        start = time.perf_counter()
        made, reused = reuse_or_generate(args.root, images=args.images) if args.keep else (None, False)
        if made is None:
            from synthetic_coco import generate

            made = generate(args.root, images=args.images)
        print(f"{'reused' if reused else 'generated'} {made.train_images} images, {made.train_boxes} boxes under "
              f"{args.root} in {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        env = child_env(args.root)
        yamls = {"yolo": made.yolo_yaml, "coco": made.coco_yaml}
        results = {layout: ours(layout, yamls[layout], args, env) for layout in args.layouts}
        theirs = ultralytics(made.yolo_yaml, args, env)
        evaluated = evaluation(args, env)
        print_tables(args, results, theirs, evaluated)
    finally:
        if not args.keep:
            if created:
                shutil.rmtree(args.root, ignore_errors=True)
            else:
                for part in ("pool", "yolo", "coco", "home", "synthetic_coco.json"):
                    target = args.root / part
                    shutil.rmtree(target, ignore_errors=True) if target.is_dir() else target.unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
