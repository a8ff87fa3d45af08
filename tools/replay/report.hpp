// kvtier-replay's outputs: the readable summary, the JSON object, the timeline CSV and the
// SVG plot.
#pragma once

#include <cstdio>
#include <string>

#include "options.hpp"
#include "replayer.hpp"
#include "trace.hpp"

namespace kvt::replay {

void print_summary(std::FILE *f, const Options &o, const Trace &t, const Result &r);
void print_json(std::FILE *f, const Options &o, const Trace &t, const Result &r);
// False with *error when the file cannot be written.
bool write_timeline(const std::string &path, const Options &o, const Result &r,
                    std::string *error);
bool write_plot(const std::string &path, const Options &o, const Trace &t, const Result &r,
                std::string *error);

}  // namespace kvt::replay
