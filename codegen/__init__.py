"""Code generation (later issues): lower a scheduled Program to a Plan, render, build, run it."""
