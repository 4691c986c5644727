# tests/lib: the repository kept honest (issue [10]): references to docs/*.md
# resolve and nothing points outside the repository; the generated
# src/nn/conv_tiles.h matches its generator; no long function without a
# stated reason and src/cli parsing and printing only (structure.sh). The installed library and the
# examples: tests/lib/examples.sh, registered in examples/Makefile.mk.
TESTS += tests/lib/docrefs.sh tests/lib/gen_tiles.sh tests/lib/structure.sh
EXTRA_DIST += tests/lib/docrefs.sh tests/lib/gen_tiles.sh tests/lib/structure.sh tests/lib/structure.py
