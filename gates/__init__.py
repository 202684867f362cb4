"""Gates: pure functions from stored results to a go / rollback verdict."""
