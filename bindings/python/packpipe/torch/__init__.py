"""packpipe.torch: train PyTorch models with packpipe plans.

A trainer writes its stage modules and a loss function; packpipe plans every iteration, loads the
tensors and runs the plan on the runtime's executor::

    loader = PlanLoader(dataset, cost_model=cm, shape=shape, global_batch_tokens=4096,
                        replica=groups.replica, rank=groups.pipeline_rank, dtype="fp32")
    runner = PipelineRunner({v: model.stage(plan.stages[v]) for v in my_stages}, loss_fn, optimizer,
                            groups=groups)
    for it in loader:
        result = runner.run(it)

* :class:`PlanLoader`: per-rank iterations (plan + loaded tensors), planned on every rank by the
  library's epoch planner or read from a plan file, resumable mid-epoch;
* :class:`PipelineRunner`: one rank of a multi-process job over torch.distributed (gloo or NCCL);
* :class:`LocalPipeline`: every stage in one process (debugging, one GPU);
* :mod:`packpipe.torch.models`: the reference GPT and T5 used by the tests and examples;
* :class:`Calibrator`: fits the cost model to the job's measured iterations at fixed boundaries
  and has the loader re-plan with it (the same on every rank);
* ``python3 -m packpipe.torch.run``: a launcher that starts the ranks of a job on this machine.

Importing ``packpipe`` does not need torch; importing ``packpipe.torch`` does.
"""
try:
    import torch as _torch  # noqa: F401
except ImportError as e:  # pragma: no cover - depends on the machine
    raise ImportError("packpipe.torch needs PyTorch (Debian: apt-get install --no-install-recommends python3-torch); "
                      "the rest of packpipe works without it") from e

from packpipe.torch.calibrate import CalibrationReport, Calibrator  # noqa: E402
from packpipe.torch.data import IGNORE_INDEX, Iteration, MicroBatch, PlanLoader  # noqa: E402
from packpipe.torch.runner import LocalPipeline, PipelineRunner, StepResult, TorchStageHandler, torch_dtype  # noqa: E402
from packpipe.torch.transport import ProcessGroups, TorchTransport  # noqa: E402

__all__ = ["Calibrator", "CalibrationReport", "IGNORE_INDEX", "Iteration", "MicroBatch", "PlanLoader", "LocalPipeline", "PipelineRunner", "StepResult",
           "TorchStageHandler", "torch_dtype", "ProcessGroups", "TorchTransport"]
