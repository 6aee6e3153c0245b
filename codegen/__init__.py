"""Code generation: lower a scheduled Program to a Plan, render, build, run it."""
