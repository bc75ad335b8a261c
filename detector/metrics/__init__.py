"""Everything that scores detections: the validation loop, COCO mAP (faster-coco-eval or pycocotools), matching
behind P / R, PR curves and the confusion matrix, and the per-class table.

    loop.py      run_validation: any ``infer`` over a split, letterbox undone, scored by the COCO evaluator
    coco.py      COCO ground truth, [N, 7] results, COCOeval (faster-coco-eval or pycocotools) -> EvalResult
    matching.py  prediction <-> ground-truth matching, PR curves, confusion matrix, ValidationStats
    table.py     the per-class table printed by ``val`` and at the end of training
"""
