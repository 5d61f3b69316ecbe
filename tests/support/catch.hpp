// SPDX-License-Identifier: Apache-2.0
// Catch2 v2 (Debian 12's package) or v3, behind one include.
#pragma once
#if defined(DG_CATCH2_V3)
#include <catch2/catch_all.hpp>
#else
#include <catch2/catch.hpp>
#endif
