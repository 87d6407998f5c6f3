"""The local backend: the controller's observe-plan-act loop over local processes."""
