"""Results and claims: tables makes a sweep's rows into its table (every planned point, the
experiment's pivot), claims judges an experiment's claims over every planned point (claim_spec
checks a claim as written), runs takes a training run's value, and expressions reads a claim's
`where` and bounds without running code. Read by the end of a sweep and by the report
(analysis). May import searching, store and the root modules."""
