"""The HTTP front every vriksha server uses (`vriksha serve`, `vriksha env serve`, the router): connection cap,
header/body/keep-alive deadlines, body and header size caps, the descriptor limit, rate-limited error logs;
and the validated field types of request bodies (`net.fields`)."""

from vriksha.net.config import FrontConfig
from vriksha.net.flags import add_flags, flag_name, from_args
from vriksha.net.server import FrontServer, front_config

__all__ = ["FrontConfig", "FrontServer", "add_flags", "flag_name", "from_args", "front_config"]
