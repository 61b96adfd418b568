"""Site entry points (Flower ClientApp) and example tasks."""
