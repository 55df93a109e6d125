"""HTTP routers of the scheduler, one module per resource."""
