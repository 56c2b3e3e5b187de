#!/usr/bin/env bash
# Prints the absolute form of a folder given relative to the current directory or already absolute
# (an absolute path must not be prefixed with $PWD: sqlite:////abs/path/mlflow.db is MLflow's form).
set -euo pipefail
case "$1" in
  /*) printf '%s\n' "$1" ;;
  *) printf '%s\n' "$PWD/$1" ;;
esac
