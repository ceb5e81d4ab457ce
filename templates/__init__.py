"""Jinja2 chat templates shipped with sgdsl (package data); see sgdsl.chat_template for lookup."""
