"""Scale-out serving: an OpenAI-compatible router over `vriksha serve` replicas (HTTP + KV event streams only;
it never imports the engine). `vriksha router --replica URL[,EVENTS] ...`; see docs/router.md."""
