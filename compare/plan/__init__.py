"""Stage 1, plan: the run's options, declared once, and the `RunPlan` built from them before anything
starts (a wrong option fails here)."""
