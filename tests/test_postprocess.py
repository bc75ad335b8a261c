"""Confidence filter, top-k before NMS, class-aware NMS and the per-image detection cap."""

from __future__ import annotations

import pytest
import torch
from torchvision.ops import batched_nms, box_iou

from detector.postprocess import NMSConfig, non_max_suppression
from tests.host_reads import HostReads
from tests.test_nms import clustered


def random_decoded(batch: int, anchors: int, classes: int, *, seed: int) -> torch.Tensor:
    """Clustered boxes (so NMS suppresses) with distinct random scores (so no order depends on ties)."""
    generator = torch.Generator().manual_seed(seed)
    centres = torch.rand(batch, anchors, 2, generator=generator) * 100
    sizes = torch.rand(batch, anchors, 2, generator=generator) * 30 + 5
    boxes = torch.cat((centres - sizes / 2, centres + sizes / 2), -1)
    scores = torch.rand(batch, anchors, classes, generator=generator) ** 3
    return torch.cat((boxes, scores), -1)


def candidates(image: torch.Tensor, conf: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    anchor_idx, labels = (image[:, 4:] > conf).nonzero(as_tuple=True)
    return image[anchor_idx, :4], image[anchor_idx, 4 + labels], labels


@pytest.mark.parametrize("max_detections", [300, 7])
def test_top_k_changes_nothing_below_k(max_detections):
    decoded = random_decoded(3, 400, 3, seed=0)
    capped = NMSConfig(conf_threshold=0.001, max_detections=max_detections, max_candidates=1200, multi_label=True)
    uncapped = NMSConfig(conf_threshold=0.001, max_detections=max_detections, max_candidates=10**9, multi_label=True)
    for got, want in zip(non_max_suppression(decoded, capped), non_max_suppression(decoded, uncapped)):
        assert all(torch.equal(got[key], want[key]) for key in ("boxes", "scores", "labels"))
        assert len(got["scores"]) <= max_detections


def test_top_k_keeps_the_highest_scores_when_more_pass_conf():
    decoded = random_decoded(2, 400, 3, seed=1)
    config = NMSConfig(conf_threshold=0.001, iou_threshold=0.7, max_candidates=50, multi_label=True)
    for image, got in zip(decoded, non_max_suppression(decoded, config)):
        boxes, scores, labels = candidates(image, 0.001)
        assert len(scores) > 50
        top = scores.topk(50).indices
        keep = batched_nms(boxes[top], scores[top], labels[top], 0.7)
        assert torch.equal(got["scores"], scores[top][keep])
        assert torch.equal(got["boxes"], boxes[top][keep])


def test_detections_sorted_and_class_aware():
    decoded = random_decoded(1, 300, 2, seed=2)
    out = non_max_suppression(decoded, NMSConfig(conf_threshold=0.01, iou_threshold=0.5, multi_label=True))[0]
    assert torch.all(out["scores"][:-1] >= out["scores"][1:])
    for label in out["labels"].unique():
        same = out["boxes"][out["labels"] == label]
        iou = torch.triu(box_iou(same, same), diagonal=1)
        assert iou.max() <= 0.5


def test_empty_image_gives_empty_detections():
    decoded = torch.zeros(2, 10, 4 + 3)
    out = non_max_suppression(decoded, NMSConfig(conf_threshold=0.5, multi_label=True))
    assert [len(d["scores"]) for d in out] == [0, 0]
    assert out[0]["boxes"].shape == (0, 4)



def test_images_are_chunked_under_the_one_call_limit():
    from detector.postprocess import image_chunks

    assert image_chunks([10, 10, 10, 10], limit=25) == [range(0, 2), range(2, 4)]
    assert image_chunks([30, 5, 5, 30], limit=25) == [range(0, 1), range(1, 3), range(3, 4)]  # too many: alone
    assert image_chunks([0, 0, 0], limit=25) == [range(0, 3)] and image_chunks([], limit=25) == []


@pytest.mark.parametrize("max_candidates", [30_000, 40])
@pytest.mark.parametrize("limit", [25_000, 100])
@pytest.mark.parametrize("multi_label", [False, True])
def test_one_call_for_the_batch_equals_one_call_per_image(multi_label, limit, max_candidates, monkeypatch):
    """The CUDA path (batched_nms over image x class groups, in chunks of images), checked on the CPU against the
    per-image one; a limit of 100 candidates splits the batch into several calls, and 40 candidates at most per
    image takes the top-k of the images above it."""
    import detector.postprocess
    from detector.postprocess import batched_non_max_suppression

    monkeypatch.setattr(detector.postprocess, "ONE_CALL_BOXES", limit)
    decoded = random_decoded(4, 300, 3, seed=3)
    decoded[2, :, 4:] = 0  # an image without candidates
    config = NMSConfig(conf_threshold=0.05, iou_threshold=0.5, max_detections=20, multi_label=multi_label,
                       max_candidates=max_candidates)
    per_image, batched = non_max_suppression(decoded, config), batched_non_max_suppression(decoded, config)
    assert len(batched) == 4 and len(batched[2]["scores"]) == 0
    for got, want in zip(batched, per_image):
        assert all(torch.equal(got[key], want[key]) for key in ("boxes", "scores", "labels"))
    assert sum(len(result["scores"]) for result in batched) > 20  # NMS and the cap had work to do
    counts = [len(detector.postprocess.candidates(image, config)[1]) for image in decoded]
    assert len(detector.postprocess.image_chunks(counts, limit)) == (1 if limit == 25_000 else
                                                                     3 if max_candidates > 1000 else 2)
    if max_candidates < 1000:
        assert max(counts) == max_candidates  # the top-k cut the images above it


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_group_far_down_the_batch_keeps_what_its_own_nms_keeps(seed):
    """Both paths put many groups (image x class) into one torchvision call, which shifts each group's boxes by
    group x (largest coordinate + 1): for the last image's last class at 32 images x 80 classes, by ~1.8e6 px,
    where FP32 coordinates are 0.125 px apart. Small boxes (4-24 px) and jittered copies of them put many pairs
    near the IoU threshold; the reference is NMS over that group's own boxes. In FP32 the batched path kept or
    dropped 3-8 of ~710 boxes differently for each of these seeds, and the per-image one 1 for seed 1. Under 1,000
    boxes, so torchvision shifts on the CPU too, as it does on CUDA up to 25,000."""
    from torchvision.ops import nms

    from detector.postprocess import batched_non_max_suppression

    generator = torch.Generator().manual_seed(seed)
    batch, classes, half = 32, 80, 480
    corners = torch.rand(half, 2, generator=generator) * 600
    originals = torch.cat((corners, corners + 4 + torch.rand(half, 2, generator=generator) * 20), 1)
    boxes = torch.cat((originals, originals + torch.randn(half, 4, generator=generator) * 1.5))
    boxes[:, 2:] = torch.maximum(boxes[:, 2:], boxes[:, :2] + 1)
    boxes[0] = torch.tensor([0.0, 0.0, 700.0, 700.0])  # the largest coordinate, which sets the shift
    scores = torch.rand(2 * half, generator=generator) * 0.7 + 0.3
    decoded = torch.zeros(batch, 2 * half, 4 + classes)
    decoded[-1, :, :4], decoded[-1, :, -1] = boxes, scores
    config = NMSConfig(conf_threshold=0.3, iou_threshold=0.7, max_detections=1000)
    expected = boxes[nms(boxes.double(), scores.double(), config.iou_threshold)]
    assert len(expected) < len(boxes) - 200  # NMS had pairs to decide
    for path in (non_max_suppression, batched_non_max_suppression):
        kept = path(decoded, config)[-1]["boxes"]
        assert torch.equal(kept, expected), path.__name__


@pytest.mark.parametrize("multi_label", [False, True])
def test_the_cuda_path_reads_the_host_as_often_for_2_images_as_for_16(multi_label):
    """Each host read waits for the GPU: the batched path's count must not grow with the batch (it was ~4 per
    image: 66 for 16). Under 1,000 candidates a batch, so torchvision takes the one-call path it takes on CUDA
    (there below 25,000)."""
    from detector.postprocess import batched_non_max_suppression

    config = NMSConfig(conf_threshold=0.6, iou_threshold=0.5, max_detections=20, multi_label=multi_label)
    reads = []
    for batch in (2, 16):
        decoded = random_decoded(batch, 100, 3, seed=batch)
        above = decoded[..., 4:] > config.conf_threshold
        assert 0 < int((above if multi_label else above.any(-1)).sum()) < 1000  # the candidates
        with HostReads() as seen:
            results = batched_non_max_suppression(decoded, config)
        assert len(results) == batch and sum(len(r["scores"]) for r in results) > 0
        reads.append(len(seen.seen))
    assert reads[0] == reads[1] <= 4, reads


@pytest.mark.parametrize("multi_label", [False, True])
def test_images_side_by_side_on_threads_give_the_one_thread_result(multi_label, monkeypatch):
    """On the CPU a batch's images go through NMS on a thread each (up to torch's thread count): the same
    detections, in image order, as one image after another."""
    import detector.postprocess

    decoded = random_decoded(5, 300, 3, seed=4)
    decoded[1, :, 4:] = 0  # an image without candidates
    config = NMSConfig(conf_threshold=0.05, iou_threshold=0.5, max_detections=20, multi_label=multi_label)
    pools = []
    real_pool = detector.postprocess.ThreadPoolExecutor

    def counting_pool(workers: int):
        pools.append(workers)
        return real_pool(workers)

    monkeypatch.setattr(detector.postprocess, "ThreadPoolExecutor", counting_pool)
    monkeypatch.setattr(detector.postprocess.torch, "get_num_threads", lambda: 1)
    one_thread = non_max_suppression(decoded, config)
    monkeypatch.setattr(detector.postprocess.torch, "get_num_threads", lambda: 3)
    threaded = non_max_suppression(decoded, config)
    assert pools == [3]  # one thread ran no pool; three threads ran one of three
    assert len(threaded) == 5 and len(threaded[1]["scores"]) == 0
    for got, want in zip(threaded, one_thread):
        assert all(torch.equal(got[key], want[key]) for key in ("boxes", "scores", "labels"))
    assert sum(len(result["scores"]) for result in threaded) > 20


@pytest.mark.parametrize("max_detections,settles", [(12, True), (250, False)])
def test_the_first_pass_over_each_images_best_gives_the_whole_runs_detections(max_detections, settles,
                                                                              monkeypatch):
    """Both paths run NMS over each image's best FIRST_PASS_CANDIDATES first and keep that when it settles (12
    detections, all above the pass's lowest score), else again over every candidate (250 asked of a pass of 250
    that keeps fewer): the same detections as NMS over all of them, for the image under the pass's size too."""
    import detector.postprocess
    from detector.postprocess import batched_non_max_suppression

    decoded = random_decoded(3, 400, 3, seed=5)
    decoded[1, 40:, 4:] = 0  # 120 candidates or fewer: under the first pass's size
    config = NMSConfig(conf_threshold=0.001, iou_threshold=0.5, max_detections=max_detections, multi_label=True)
    monkeypatch.setattr(detector.postprocess, "FIRST_PASS_CANDIDATES", 10**9)  # one pass: the reference
    reference = non_max_suppression(decoded, config)
    monkeypatch.setattr(detector.postprocess, "FIRST_PASS_CANDIDATES", 200)
    sizes = []
    real_nms = detector.postprocess.grouped_nms
    monkeypatch.setattr(detector.postprocess, "grouped_nms",
                        lambda boxes, *rest: sizes.append(len(boxes)) or real_nms(boxes, *rest))
    for path in (non_max_suppression, batched_non_max_suppression):
        sizes.clear()
        results = path(decoded, config)
        for got, want in zip(results, reference, strict=True):
            assert all(torch.equal(got[key], want[key]) for key in ("boxes", "scores", "labels")), path.__name__
        assert len(reference[0]["scores"]) == max_detections or not settles
        over = max(sizes)  # the per-image path: one call per image; the batched one: one for all the first passes
        assert (over <= 2 * 200 + 120) if settles else (over > 1000), (path.__name__, sizes)


def test_detections_go_to_the_host_in_one_copy_whatever_the_batch():
    """One host read for 2 images as for 16 (on CUDA each is a wait); each image gets its own tensors, boxes in
    FP32 with the values sent, the other fields in their own dtypes, an image without detections kept."""
    from detector.postprocess import detections_to_host

    generator = torch.Generator().manual_seed(0)
    reads = []
    for batch in (2, 16):
        detections = [{"boxes": (torch.rand(count, 4, generator=generator) * 600).half(),
                       "scores": torch.rand(count, generator=generator).half(),
                       "labels": torch.randint(0, 80, (count,), generator=generator)}
                      for count in [3, 0, *range(1, batch - 1)]]
        with HostReads() as seen:
            host = detections_to_host(detections)
        reads.append(len(seen.seen))
        for got, sent in zip(host, detections, strict=True):
            assert got["boxes"].dtype == torch.float32 and torch.equal(got["boxes"], sent["boxes"].float())
            assert got["scores"].dtype == torch.float16 and torch.equal(got["scores"], sent["scores"])
            assert got["labels"].dtype == torch.int64 and torch.equal(got["labels"], sent["labels"])
            assert got["boxes"].untyped_storage().nbytes() == 4 * got["boxes"].numel()  # not a view of the batch
    assert reads == [1, 1]
    shifted = detections_to_host(detections, lambda boxes, counts: boxes + len(counts))
    assert torch.equal(shifted[0]["boxes"], detections[0]["boxes"].float() + 16)


def test_decode_level_by_level_is_the_decode_of_the_concatenation():
    """decode_outputs decodes each level and concatenates the results; the formula over all levels at once gives
    the same numbers (every operation is per anchor), up to the kernels a library picks by tensor size."""
    from detector.boxes import dfl_expectation, distances_to_boxes, flatten_head_outputs, make_anchors
    from detector.postprocess import decode_outputs

    torch.manual_seed(0)
    reg_max, classes, strides = 16, 3, (8, 16, 32)
    outputs = [torch.randn(2, 4 * reg_max + classes, s, s + 1).contiguous(memory_format=torch.channels_last)
               for s in (8, 4, 2)]
    flat = flatten_head_outputs(outputs)
    points, stride = make_anchors([o.shape[2:] for o in outputs], strides, device=flat.device, dtype=flat.dtype)
    boxes = distances_to_boxes(points, dfl_expectation(flat[..., : 4 * reg_max], reg_max)) * stride
    expected = torch.cat((boxes, flat[..., 4 * reg_max :].sigmoid()), -1)
    decoded = decode_outputs(outputs, strides, reg_max)
    # A kernel chosen by size may sum the 16 bins in another order: each expectation (at most 15 grid units, a sum
    # of 16 non-negative terms) may then move by 16 * 2**-23 * 15 = 2.9e-5 grid units, a box corner by that times
    # the largest stride, 32: 9.3e-4 px, plus a product's rounding near 640 px, 2**-24 * 640 = 3.8e-5 px: 1e-3 px.
    # A sigmoid computed on a vector lane or in a scalar tail: 1e-6.
    torch.testing.assert_close(decoded[..., :4], expected[..., :4], rtol=0, atol=1e-3)
    torch.testing.assert_close(decoded[..., 4:], expected[..., 4:], rtol=0, atol=1e-6)


def textbook_nms(boxes: torch.Tensor, scores: torch.Tensor, labels: torch.Tensor, iou_threshold: float,
                 max_detections: int) -> list[int]:
    """Greedy NMS one box at a time, the order spelled out: by score, descending, equal scores by index; a box is
    kept unless a kept box of its class overlaps it by more than the threshold (FP64 IoU)."""
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    iou = box_iou(boxes.double(), boxes.double())
    kept: list[int] = []
    for i in order:
        if all(labels[k] != labels[i] or iou[i, k] <= iou_threshold for k in kept):
            kept.append(i)
    return kept[:max_detections]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs CUDA"))])
@pytest.mark.parametrize("first_pass", [10**9, 60])
@pytest.mark.parametrize("fixed_point_from", [0, 10**9])  # on CUDA: every batch through fixed_point_nms, or none
def test_equal_scores_are_decided_by_candidate_order_on_every_path(device, first_pass, fixed_point_from, monkeypatch):
    """FP16 scores tie often, and of two overlapping equal-scored boxes the one NMS meets first is kept: both paths,
    with or without the first pass over each image's best, keep what textbook NMS keeps when equal scores go in
    the candidates' own order (anchor by anchor, class by class): the same boxes on the CPU and on CUDA, with
    torchvision's kernel or fixed_point_nms there."""
    import detector.postprocess
    from detector.postprocess import batched_non_max_suppression

    if device == "cpu" and fixed_point_from == 0:
        pytest.skip("the batched path runs fixed_point_nms on CUDA only (on the CPU: test_the_fixed_point_path_...)")
    monkeypatch.setattr(detector.postprocess, "FIXED_POINT_FROM", fixed_point_from)

    decoded = random_decoded(3, 150, 2, seed=7)
    decoded[..., 4:] = (decoded[..., 4:] * 6).ceil() / 6  # six score values: ties everywhere
    decoded[:, 1::2, :4] = decoded[:, 0::2, :4]  # every odd anchor is the even one's box: equal boxes, often tied
    config = NMSConfig(conf_threshold=0.1, iou_threshold=0.5, max_detections=25, multi_label=True)
    monkeypatch.setattr(detector.postprocess, "FIRST_PASS_CANDIDATES", first_pass)
    expected = []
    for image in decoded:
        boxes, scores, labels = candidates(image, config.conf_threshold)
        keep = textbook_nms(boxes, scores, labels, config.iou_threshold, config.max_detections)
        expected.append((boxes[keep], scores[keep], labels[keep]))
        assert len(scores) > 3 * first_pass or first_pass > len(scores)  # a first pass over part of it, or none
    tied = sum(len(s) - len(s.unique()) for _, s, _ in expected)
    assert tied > 50  # kept boxes share scores: the order among equal scores decided real cases
    for path in (non_max_suppression, batched_non_max_suppression):
        results = path(decoded.to(device), config)
        for got, (boxes, scores, labels) in zip(results, expected, strict=True):
            assert torch.equal(got["boxes"].cpu(), boxes), path.__name__
            assert torch.equal(got["scores"].cpu(), scores) and torch.equal(got["labels"].cpu(), labels)


@pytest.mark.parametrize("max_detections", [300, 9])
def test_the_fixed_point_path_gives_what_torchvisions_kernel_gives_for_the_batch(max_detections):
    """postprocess._fixed_point (CUDA's path for images of up to FIXED_POINT_CANDIDATES candidates, run here on the
    CPU) against _in_chunks over torchvision's kernel: the same boxes, scores and labels per image, in the same
    order, with equal scores (FP16-like ties), an image with no candidates, and the max_detections cut."""
    from detector.postprocess import _fixed_point, _in_chunks, above_conf

    decoded = random_decoded(5, 120, 3, seed=3)
    decoded[..., 4:] = (decoded[..., 4:] * 8).ceil() / 8  # ties
    decoded[:, 1::2, :4] = decoded[:, 0::2, :4]  # equal boxes, often with equal scores
    decoded[2, :, 4:] = 0  # an image with no candidates
    config = NMSConfig(conf_threshold=0.2, iou_threshold=0.5, max_detections=max_detections, multi_label=True)
    (image, _), boxes, scores, labels = above_conf(decoded, config)
    counts = torch.bincount(image, minlength=len(decoded)).tolist()
    assert counts[2] == 0 and min(c for i, c in enumerate(counts) if i != 2) > 100
    expected = _in_chunks(boxes, scores, labels, image, counts, 3, config)
    got = _fixed_point(boxes, scores, labels, image, counts, config)
    assert got is not None and len(got) == len(expected)
    for mine, theirs in zip(got, expected):
        assert all(torch.equal(mine[key], theirs[key]) for key in ("boxes", "scores", "labels"))
    kept = [len(result["scores"]) for result in expected]
    assert kept[2] == 0 and (max(kept) == max_detections if max_detections < 50 else max(kept) < max_detections)


def test_a_fixed_point_that_does_not_settle_leaves_the_batch_to_torchvisions_kernel(monkeypatch):
    """With fewer steps allowed than the fixed point needs, the batched path falls back to the kernel, per chunk, and
    answers as it would have (the CUDA-only switch forced on here, so the CPU runs that branch)."""
    import detector.postprocess
    from detector.postprocess import _in_chunks, above_conf

    decoded = random_decoded(4, 120, 3, seed=5)
    config = NMSConfig(conf_threshold=0.2, iou_threshold=0.5, max_detections=50, multi_label=True)
    (image, _), boxes, scores, labels = above_conf(decoded, config)
    counts = torch.bincount(image, minlength=len(decoded)).tolist()
    expected = _in_chunks(boxes, scores, labels, image, counts, 3, config)
    monkeypatch.setattr(detector.postprocess, "use_fixed_point", lambda *_: True)
    calls = []
    original = detector.postprocess._fixed_point
    monkeypatch.setattr(detector.postprocess, "_fixed_point", lambda *args: calls.append(original(*args)) or calls[-1])
    for steps, settles in ((1, False), (64, True)):
        monkeypatch.setattr(detector.postprocess, "FIXED_POINT_STEPS", steps)
        got = _in_chunks(boxes, scores, labels, image, counts, 3, config)
        assert (calls[-1] is not None) == settles
        for mine, theirs in zip(got, expected, strict=True):
            assert all(torch.equal(mine[key], theirs[key]) for key in ("boxes", "scores", "labels"))


def padded_rows(rows: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]):
    """Rows of (boxes, scores, labels) -> fixed_point_nms's inputs (each row best first, padded) and each row's
    order (row position -> index into its own boxes)."""
    width = max(len(scores) for _, scores, _ in rows)
    boxes = torch.zeros(len(rows), width, 4, dtype=torch.float64)
    labels = torch.full((len(rows), width), -1)
    valid = torch.zeros(len(rows), width, dtype=torch.bool)
    orders = []
    for row, (row_boxes, scores, row_labels) in enumerate(rows):
        order = scores.sort(descending=True, stable=True).indices
        boxes[row, : len(order)], labels[row, : len(order)] = row_boxes[order], row_labels[order]
        valid[row, : len(order)] = True
        orders.append(order)
    return boxes, labels, valid, orders


@pytest.mark.parametrize("threshold", [0.3, 0.5, 0.7])
@pytest.mark.parametrize("one_row_a_go", [False, True])
def test_fixed_point_nms_keeps_what_torchvision_keeps_row_by_row(threshold, one_row_a_go, monkeypatch):
    """Rows of different lengths (padding), three labels, dense overlaps: each row keeps what torchvision's
    batched_nms keeps for it, in the same order; also with the rows' overlaps computed and solved one row a go
    (what larger batches get)."""
    import detector.postprocess
    from detector.postprocess import fixed_point_nms

    if one_row_a_go:
        monkeypatch.setattr(detector.postprocess, "PAIRS_AT_ONCE", 1)
        monkeypatch.setattr(detector.postprocess, "PAIRS_PER_SOLVE", 1)

    rows = []
    for row, count in enumerate([300, 0, 57, 301]):
        boxes, scores = clustered(count, seed=row)
        boxes -= ((boxes[:, :2] + boxes[:, 2:]) * 0.4).repeat(1, 2)  # centres 5x closer, sizes kept: dense overlaps
        labels = torch.randint(0, 3, (count,), generator=torch.Generator().manual_seed(row))
        rows.append((boxes.double(), scores, labels))
    boxes, labels, valid, orders = padded_rows(rows)
    keep = fixed_point_nms(boxes, labels, valid, threshold, max_iterations=300)
    assert keep is not None and not keep[~valid].any()
    for row, ((row_boxes, scores, row_labels), order) in enumerate(zip(rows, orders)):
        expected = batched_nms(row_boxes, scores.double(), row_labels, threshold)
        assert torch.equal(order[keep[row, : len(order)]], expected)
    assert int(keep.sum()) < int(valid.sum()) * 0.95  # boxes were suppressed: the comparison decides something


def test_fixed_point_nms_needs_a_step_per_link_of_a_suppression_chain():
    """Boxes 1 px apart: each overlaps the next by 0.82 and the one after by 0.67, so greedy NMS keeps every other
    box, and whether box k is kept depends on box k - 1, on k - 2 ...: the fixed point takes about as many steps as
    the chain has boxes, and with fewer allowed it answers None (the caller then runs torchvision's kernel)."""
    from detector.postprocess import fixed_point_nms

    count = 40
    x = torch.arange(count, dtype=torch.float64)
    boxes = torch.stack((x, torch.zeros(count), x + 10, torch.full((count,), 10.0)), 1)[None]
    labels, valid = torch.zeros(1, count, dtype=torch.int64), torch.ones(1, count, dtype=torch.bool)
    keep = fixed_point_nms(boxes, labels, valid, 0.7, max_iterations=count + 1)
    assert keep is not None and keep[0].tolist() == [i % 2 == 0 for i in range(count)]
    assert fixed_point_nms(boxes, labels, valid, 0.7, max_iterations=count // 2) is None


def test_best_first_by_image_orders_tiny_scores_and_ties_as_a_sort_by_score_within_each_image():
    """Image-major, best first, equal scores in their own order, for scores of any size: a composite key such as
    image x 2 - score rounded scores under ~1e-15 away in every image after the first (conf 0 lets them in)."""
    from detector.postprocess import best_first_by_image

    image = torch.tensor([0, 0, 1, 1, 1, 1, 2])
    scores = torch.tensor([0.5, 0.9, 1e-17, 3e-17, 3e-17, 0.25, 0.1], dtype=torch.float32)
    order, rank = best_first_by_image(image, scores, [2, 4, 1])
    assert order.tolist() == [1, 0, 5, 3, 4, 2, 6]
    assert rank.tolist() == [0, 1, 0, 1, 2, 3, 0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_a_box_with_a_non_finite_coordinate_is_no_candidate_and_the_others_are_suppressed_as_without_it(bad):
    """A diverging model's NaN or infinite box: in torchvision's batched NMS it made every box of its call NaN (the
    class offsets scale with the largest coordinate), so nothing was suppressed. It never enters NMS now."""
    decoded = random_decoded(2, 200, 3, seed=5)
    config = NMSConfig(conf_threshold=0.05, iou_threshold=0.5, max_detections=300, multi_label=True)
    spoiled = decoded.clone()
    spoiled[0, 7, 2] = bad
    spoiled[0, 7, 4:] = 0.9  # scored high: it would be a candidate of every class
    without = decoded.clone()
    without[0, 7, 4:] = 0  # the same image without that box
    for got, expected in zip(non_max_suppression(spoiled, config), non_max_suppression(without, config), strict=True):
        assert torch.isfinite(got["boxes"]).all()
        assert all(torch.equal(got[key], expected[key]) for key in ("boxes", "scores", "labels"))


@pytest.mark.parametrize("multi_label", [False, True])
@pytest.mark.parametrize("first_pass", [10**9, 40])
def test_agnostic_nms_suppresses_across_classes_on_every_path(multi_label, first_pass, monkeypatch):
    """``agnostic`` (predict --agnostic-nms, Ultralytics' agnostic_nms): a box suppresses overlapping boxes of every
    class, and each kept one keeps its own label: textbook NMS over all candidates as one class, on the per-image,
    batched and fixed-point paths, with and without the first pass over each image's best."""
    import detector.postprocess
    from detector.postprocess import _fixed_point, above_conf, batched_non_max_suppression

    monkeypatch.setattr(detector.postprocess, "FIRST_PASS_CANDIDATES", first_pass)
    decoded = random_decoded(3, 200, 3, seed=11)
    config = NMSConfig(conf_threshold=0.05, iou_threshold=0.3, max_detections=30, multi_label=multi_label,
                       agnostic=True)
    expected = []
    for image in decoded:
        (_, ), boxes, scores, labels = above_conf(image, config)
        keep = textbook_nms(boxes, scores, torch.zeros_like(labels), config.iou_threshold, config.max_detections)
        expected.append((boxes[keep], scores[keep], labels[keep]))
        assert box_iou(boxes[keep], boxes[keep]).triu(1).max() <= 0.3  # no two kept boxes overlap, whatever class
    assert len({int(label) for _, _, labels in expected for label in labels}) == 3  # labels kept, not all 0
    per_class = non_max_suppression(decoded, NMSConfig(**{**config.__dict__, "agnostic": False}))
    assert any(box_iou(r["boxes"], r["boxes"]).triu(1).max() > 0.3 for r in per_class)  # there, boxes of two
    # classes overlap: agnostic NMS had something to suppress
    (image, _), boxes, scores, labels = above_conf(decoded, config)
    counts = torch.bincount(image, minlength=len(decoded)).tolist()
    fixed = _fixed_point(boxes, scores, labels, image, counts, config)
    for results in (non_max_suppression(decoded, config), batched_non_max_suppression(decoded, config), fixed):
        assert results is not None
        for got, (boxes, scores, labels) in zip(results, expected, strict=True):
            assert torch.equal(got["boxes"], boxes) and torch.equal(got["scores"], scores)
            assert torch.equal(got["labels"], labels)
