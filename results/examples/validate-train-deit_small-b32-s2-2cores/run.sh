#!/bin/bash
# costmodel.validate --mode train on DeiT-S batch 32, 2 ranks: GPipe, 1F1B, Interleaved1F1B (V=2), one after another
# (run from the repository root; this example's figures wrote to a scratch folder: the same commands)
out=${OUT:-results/validate-train}
mkdir -p "$out"
for s in GPipe 1F1B Interleaved1F1B; do
  v=1; [ $s = Interleaved1F1B ] && v=2
  echo "=== $s V=$v $(date +%T)"
  /usr/bin/time -f "wall %e s" .venv/bin/python -m costmodel.validate --stages 2 --mode train --schedule $s --stages-per-rank $v \
    --chunks 8,16 --cuts 3 --rounds 2 --repeats 1 --cache-dir "$out/profiles" --out "$out/$s.json" 2>&1 \
    | grep -v "trial/s\|it/s"
done
echo "=== done $(date +%T)"
