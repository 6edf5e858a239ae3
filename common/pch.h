// Precompiled header for the torch-heavy targets: keep it to the narrow ATen headers.
#pragma once
#include <ATen/ATen.h>
#include <torch/types.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>
