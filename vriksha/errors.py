"""One exception hierarchy: every message says what was wrong and what to do."""


class VrikshaError(Exception):
    """Root of every error vriksha raises on purpose."""


class ConfigError(VrikshaError, ValueError):
    """A configuration or CLI value is invalid; the message names the field."""


class ModelLoadError(VrikshaError):
    """A model path or file could not be loaded."""


class InvalidRequestError(VrikshaError, ValueError):
    """A request (prompt or sampling parameters) is invalid; nothing else is disturbed."""


class PromptTooLongError(InvalidRequestError):
    """A prompt (plus the tokens it asks for) does not fit the model's context."""


class EngineFailedError(VrikshaError):
    """The engine cannot go on (a tensor-parallel rank died): the requests in flight fail, and so does every
    later one; restart the engine."""


class OutOfKVMemoryError(VrikshaError):
    """A single request needs more KV memory than the whole pool holds."""


class KVTransferError(VrikshaError):
    """A K/V transfer failed (the other side is gone, timed out, or serves another model); nothing is kept."""
