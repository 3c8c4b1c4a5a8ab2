"""Which plans exist and which to try next: the plan space and its layouts, the seeds, the sampler and its
proposals, the cost model's optimum, prices and pruning rules, and the memory a plan needs."""
