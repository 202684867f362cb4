"""The acceptance protocol: spec, plan and the Prefect flow that runs it."""
