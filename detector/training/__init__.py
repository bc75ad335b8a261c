"""Training: the run (trainer), its step (engine), what it is built from (builders, config) and what it plans
with (budget, probe, schedule, optim, ema, multiscale, amp_check). Named ``training``, not ``train``, so that
``detector.train`` stays the API's function (see detector/__init__.py)."""
