// kvtier-replay's outputs: the readable summary, the JSON object, the timeline CSV and the
// SVG plot.
#pragma once

#include <cstdio>
#include <string>

#include "engine_sim.hpp"
#include "options.hpp"
#include "replayer.hpp"
#include "trace.hpp"

namespace kvt::replay {

void print_summary(std::FILE *f, const Options &o, const Trace &t, const Result &r);
void print_json(std::FILE *f, const Options &o, const Trace &t, const Result &r);
// --mode engine's summary and JSON object.
void print_engine_summary(std::FILE *f, const Options &o, const Trace &t, const EngineResult &r);
void print_engine_json(std::FILE *f, const Options &o, const Trace &t, const EngineResult &r);
// False with *error when the file cannot be written.
bool write_timeline(const std::string &path, const Options &o, const Result &r,
                    std::string *error);
bool write_plot(const std::string &path, const Options &o, const Trace &t, const Result &r,
                std::string *error);

}  // namespace kvt::replay
