"""The plan pass: between the policy and the names, typed specializations -> one frozen plan
per specialization (statements, precision blocks, spelled casts, hoists) and the module's
methods (sx2torch/plan/methods.py); emission only prints it."""

from sx2torch.plan.methods import Plan, Plans, run, verify

__all__ = ["Plan", "Plans", "run", "verify"]
