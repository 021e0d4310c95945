"""Config-driven experiment runner for timm image models."""
