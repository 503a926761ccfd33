"""The Ray launcher: every role of a job as Ray actors in one placement group (`launcher.py`), each service a
`vriksha` server run by its actor (`actors.py`), watched and restarted by the driver (`supervisor.py`)."""
