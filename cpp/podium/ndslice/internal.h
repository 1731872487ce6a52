// Formatting helpers shared by the ndslice sources; not part of the public surface.
#pragma once

#include <cstddef>
#include <initializer_list>
#include <span>
#include <string>
#include <string_view>

#include "podium/base/error.h"
#include "podium/ndslice/errc.h"

namespace podium::ndslice::internal {

// 'gpus'
std::string quoted(std::string_view label);
// ['hosts', 'gpus']
std::string format_labels(std::span<const std::string> labels);
// [2, 4]
std::string format_sizes(std::span<const size_t> sizes);

// An Error whose message is the concatenation of `parts`.
Error error(NdsliceErrc code, std::initializer_list<std::string_view> parts);

// Prefixes `context` to the message of an error raised by a lower-level step.
Error in_context(std::string_view context, Error e);

}  // namespace podium::ndslice::internal
