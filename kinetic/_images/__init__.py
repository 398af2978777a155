"""Image builders (IO edge): the runner image, built with the local Docker Engine."""
