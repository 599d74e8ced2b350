#!/usr/bin/env bash
# Jane Austen's six novels as plain text files, for training small checkpoints on real English.
#
#     benchmarks/austen_text.sh [OUT]      # default benchmarks/out/austen; needs root for apt-get, or the package
#
# The texts are Project Gutenberg's editions (public domain), as Debian packages them in r-cran-janeaustenr
# (the packaging is MIT-licensed). The R package stores them as line vectors; Rscript writes each one out.
# Persuasion is the novel the export's built-in evaluation sample comes from (export/data/), so trainers that
# want held-out text leave it out (benchmarks/train_small.py does).
set -euo pipefail
out=${1:-"$(dirname "$0")/out/austen"}
if ! Rscript -e 'library(janeaustenr)' >/dev/null 2>&1; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends r-cran-janeaustenr
fi
mkdir -p "$out"
Rscript -e '
  library(janeaustenr)
  out <- commandArgs(trailingOnly = TRUE)[1]
  books <- list(sensesensibility = sensesensibility, prideprejudice = prideprejudice, mansfieldpark = mansfieldpark,
                emma = emma, northangerabbey = northangerabbey, persuasion = persuasion)
  for (name in names(books)) writeLines(books[[name]], file.path(out, paste0(name, ".txt")))
' "$out"
ls -l "$out"
