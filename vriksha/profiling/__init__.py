"""Profiling built in: named phases, step-scheduled trace capture, and a trace report."""

from vriksha.profiling.annotate import phase, profiler_active
from vriksha.profiling.capture import ProfileConfig, StepProfiler, add_profile_args

__all__ = ["ProfileConfig", "StepProfiler", "add_profile_args", "phase", "profiler_active"]
