"""packpipe.torch: train PyTorch models with packpipe plans (the user guide: docs/guide.md).

A trainer writes its model (or stage modules) and a loss function; packpipe plans every iteration,
loads the tensors and runs the plan::

    cm = cost_model(model, "A100-80GB")                    # the cost model of your nn.Module
    loader = PlanLoader(dataset, cost_model=cm, shape=shape, global_batch_tokens=4096)
    runner = PipelineRunner({v: my_stage(loader.stages[v]) for v in loader.my_stages}, summed_token_loss,
                            optimizer, groups=groups)
    for it in loader:
        result = runner.run(it)

* :class:`PlanLoader`: per-rank iterations (plan + loaded tensors), planned on every rank by the
  library's epoch planner or read from a plan file; epochs as DistributedSampler (set_epoch),
  resumable mid-epoch;
* :class:`GradientAccumulation`: data parallelism (DDP) and gradient accumulation over one-stage
  plans in the trainer's own loop;
* :class:`PipelineRunner`: one rank of a multi-process pipeline over torch.distributed (gloo or NCCL);
* :class:`LocalPipeline`: every stage in one process (debugging, one GPU);
* :func:`cost_model` / :func:`describe_model`: packpipe's cost model of a torch model;
* :func:`summed_token_loss`: the loss packpipe expects (summed over tokens);
* :mod:`packpipe.torch.attention`: attention that keeps a micro-batch's samples apart;
* :mod:`packpipe.torch.models`: the reference GPT and T5 used by the tests and examples;
* :class:`Calibrator`: fits the cost model to the job's measured iterations at fixed boundaries
  and has the loader re-plan with it (the same on every rank; PlanLoader does it by default);
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
from packpipe.torch.loss import check_summed_loss, summed_token_loss  # noqa: E402
from packpipe.torch.describe import ModelDescriptionError, cost_model, describe_model  # noqa: E402
from packpipe.torch.dataparallel import GradientAccumulation  # noqa: E402
from packpipe.torch.compare import Comparison, compare  # noqa: E402
from packpipe.torch.hf import HFCausalLM  # noqa: E402

__all__ = ["Calibrator", "CalibrationReport", "IGNORE_INDEX", "Iteration", "MicroBatch", "PlanLoader", "LocalPipeline",
           "Comparison", "compare", "HFCausalLM", "PipelineRunner", "StepResult", "TorchStageHandler", "torch_dtype", "ProcessGroups", "TorchTransport",
           "GradientAccumulation", "summed_token_loss", "check_summed_loss", "cost_model", "describe_model",
           "ModelDescriptionError"]
