"""`mlxcel serve`'s exit statuses, which supervisors act on (docs/deployment.md)."""

EXIT_CONFIG = 2  # the profile, the port or the models cannot work: a restart would not help
EXIT_FAILURE = 1  # the models failed to load for another reason, or the engine failed while serving
