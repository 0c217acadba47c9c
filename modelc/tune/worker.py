"""A measurement worker process: builds (compiles) or runs one candidate kernel per request.

Requests and answers are JSON lines on stdin/stdout, so the parent can kill a worker that hangs
or crashes and start a new one: a bad kernel costs one record, never the tuning run. Run timings
happen in a worker of their own, one candidate at a time, so compiles never disturb them.
"""
from __future__ import annotations

import json
import sys
import time
import traceback


def _handle(req: dict, refs: dict) -> dict:
    from ..kernels import cache, testing
    from ..kernels.template import get
    from ..kernels.workload import Workload
    from . import cache_flush
    from . import records as R

    wl = Workload(req["workload"])
    tpl = get(req["template"])
    cfg = tpl.space(wl).from_values(req["config"])
    try:
        kernel = tpl.build(wl, cfg)
        fn = cache.load(kernel.source)
    except Exception as e:
        return {"error": R.COMPILE_ERROR, "msg": f"{type(e).__name__}: {e}"[:500]}
    if req["op"] == "build":
        return {"error": R.NO_ERROR}
    try:
        key = req["key"]
        if key not in refs:
            inputs = wl.random_inputs(seed=0)
            refs.clear()
            refs[key] = (inputs, testing.reference_outputs(wl, inputs))
        inputs, want = refs[key]
        args, outs = testing.bind(wl, kernel, inputs)
        fn(*args)
        from ..kernels.layout import from_physical
        got = [from_physical(o, t.shape, t.layout) for o, t in zip(outs, wl.outputs)]
        err = testing.max_rel_error(got, want)
        if not err <= req.get("tolerance", 1e-4):
            return {"error": R.WRONG_RESULT, "msg": f"max error {err:.3g} relative to the output scale"}
        time.sleep(0.05)        # let threads of whatever ran before (builds, numpy) go idle
        flush = []
        if req.get("cache_flush") and cache_flush.supported():    # weights cold, as in a module
            flush = [a for name, a in zip(kernel.args, args)
                     if not name.startswith(("in", "out")) or
                     (name.startswith("in") and wl.inputs[int(name[2:])].const)]
        costs = testing.time_kernel(fn, args, req.get("number", 5), req.get("repeat", 3),
                                    req.get("min_repeat_ms", 0.0), flush=flush)
    except Exception as e:
        return {"error": R.RUNTIME_ERROR, "msg": f"{type(e).__name__}: {e}"[:500]}
    return {"error": R.NO_ERROR, "costs": costs}


def main():
    refs: dict = {}
    for line in sys.stdin:
        try:
            req = json.loads(line)
            res = _handle(req, refs)
        except Exception:
            res = {"error": 2, "msg": traceback.format_exc()[-500:]}
        sys.stdout.write(json.dumps(res) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
