"""Launchers: where the parts of a training or a serving fleet run. torchrun for training ranks on one or
several nodes, Ray for placing every role of an RL job (trainer ranks, rollout servers, router, environment
servers) on a cluster, the one-host fleet (`vriksha fleet`). Kubernetes manifests live in deploy/kubernetes."""
