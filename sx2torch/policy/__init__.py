"""The policy pass: graphs + a run's precision -> typed specializations (rules 6.1-6.8)."""

from sx2torch.policy.rules import Lowered, Typed, run, verify

__all__ = ["Lowered", "Typed", "run", "verify"]
