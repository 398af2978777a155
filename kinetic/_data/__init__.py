"""Local and remote data dependencies of jobs: the ``Data`` value and content hashing."""
