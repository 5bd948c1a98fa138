// Function multi-versioning for hot loops: an AVX2 clone chosen at load time where the CPU has it.
#pragma once

/// Put before a function definition whose loop vectorises: GCC on x86-64 ELF builds an AVX2 and a
/// default version and picks one at load time; elsewhere (clang, other targets) it is empty. Only
/// for code whose results cannot differ between the versions (no FMA contraction, no
/// reassociation: additions, comparisons and selects of the same operands).
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && defined(__ELF__)
#define PACKPIPE_TARGET_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define PACKPIPE_TARGET_CLONES
#endif
