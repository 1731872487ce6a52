#include "podium/ndslice/internal.h"

namespace podium::ndslice::internal {

std::string quoted(std::string_view label) {
  std::string out = "'";
  out += label;
  out += '\'';
  return out;
}

std::string format_labels(std::span<const std::string> labels) {
  std::string out = "[";
  for (size_t i = 0; i < labels.size(); ++i) {
    if (i > 0) out += ", ";
    out += quoted(labels[i]);
  }
  return out + "]";
}

std::string format_sizes(std::span<const size_t> sizes) {
  std::string out = "[";
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(sizes[i]);
  }
  return out + "]";
}

Error error(NdsliceErrc code, std::initializer_list<std::string_view> parts) {
  std::string message;
  for (std::string_view part : parts) message += part;
  return make_error(code, std::move(message));
}

Error in_context(std::string_view context, Error e) {
  std::string message(context);
  message += ": ";
  message += e.message;
  e.message = std::move(message);
  return e;
}

}  // namespace podium::ndslice::internal
