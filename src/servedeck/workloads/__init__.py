"""What a measured server is sent: the workload kinds (kinds.py lists them; one module each) and the
machinery they share (shape.py, points.py, session.py). A kind from an outside package registers through
the `servedeck.workloads` entry point, as kinds.py says.

Nothing is re-exported here: `servedeck.workloads.NAME` is always the module NAME.py."""
