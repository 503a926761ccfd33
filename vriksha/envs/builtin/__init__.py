"""The built-in environments; importing this package registers them."""

from vriksha.envs.builtin.arithmetic import ArithmeticEnv
from vriksha.envs.builtin.calculator_tools import CalculatorToolsEnv
from vriksha.envs.builtin.python_functions import PythonFunctionsEnv

__all__ = ["ArithmeticEnv", "CalculatorToolsEnv", "PythonFunctionsEnv"]
