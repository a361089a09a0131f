#!/usr/bin/env bash
# gpu_session.sh on whichever card the call got, never mixing cards in a grid: on an H200 into
# results/h200 with the h200_ grids, on any other card into results/h100 with the h100_ grids
# (GRIDS defaults to CARD_calibration, PAIRED_GRID to CARD_paired). A paired plan made here for
# each card (.paired_h200/, .paired_h100/: order.tsv) becomes the call's .paired_calls/.
#   STEPS="grids" [GRIDS=...] tools/offline-gpu/by_card.sh
set -u
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$name" in *H200*) card=h200 ;; *) card=h100 ;; esac
echo "card: $name -> results/$card"
export GRIDS=${GRIDS:-${card}_calibration} PAIRED_GRID=${card}_paired
if [ -d ".paired_$card" ]; then rm -rf .paired_calls && cp -r ".paired_$card" .paired_calls; fi
exec bash tools/offline-gpu/gpu_session.sh "results/$card"
