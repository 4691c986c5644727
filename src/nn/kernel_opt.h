/* The optimisation pragma of the kernel files (conv_kernels.c, conv_bf16.c,
 * conv_pointwise.c), included first. With AVX-512 they are built at -O3.
 * Without it (an AVX2 machine's -march=native) each 16-float vector is two
 * 256-bit registers, half as many as the kernels were shaped for, and on
 * the spills GCC 12's global CSE passes took 13 minutes for
 * conv_pointwise.c alone (a Zen 3, 2026-12-07; twice per build, libtool's
 * PIC and static objects): those two passes are left out there. */
#ifdef __AVX512F__
#pragma GCC optimize("O3")
#else
#pragma GCC optimize("O3", "no-gcse", "no-gcse-after-reload")
#endif
