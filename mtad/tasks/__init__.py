"""Evaluation tasks: each one module (loading + prompt) plus one YAML under conf/task/."""
