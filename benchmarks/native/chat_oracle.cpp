// Oracle for llama_cffi's chat sessions and tool calls: llama.cpp's own chat machinery
// (common_chat_templates_init / _apply / common_chat_parse, common/chat.cpp).
//
// usage: chat_oracle MODEL < request.json
//   request: {"messages": [OpenAI-style messages], "tools": [OpenAI-style tools] (optional),
//             "template": "override text" (optional), "tool_choice": "auto" (optional),
//             "parallel_tool_calls": false, "add_generation_prompt": true,
//             "outputs": ["model output to parse", ...]}
//   prints JSON: {"prompt", "format", "grammar", "grammar_lazy", "grammar_triggers": [{"type", "value"}],
//                 "preserved_tokens", "additional_stops", "generation_prompt", "caps",
//                 "parsed": [{"content", "reasoning_content", "tool_calls": [{"name", "arguments", "id"}]}]}
//   exit 1 with the exception's message on stderr when llama.cpp throws.
#include "chat.h"
#include "common.h"
#include "json.h"
#include "llama.h"

#include <cstdio>
#include <iostream>
#include <iterator>
#include <string>

using json = common_json;

int main(int argc, char ** argv) {
    if (argc != 2) {
        std::fprintf(stderr, "usage: %s MODEL < request.json\n", argv[0]);
        return 2;
    }
    llama_log_set([](ggml_log_level, const char *, void *) {}, nullptr);
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.vocab_only = true;
    llama_model * model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        std::fprintf(stderr, "cannot load %s\n", argv[1]);
        return 2;
    }
    std::string input((std::istreambuf_iterator<char>(std::cin)), std::istreambuf_iterator<char>());
    try {
        json req = json::parse(input);
        auto tmpls = common_chat_templates_init(model, req.value("template", std::string()));
        common_chat_templates_inputs in;
        in.messages = common_chat_msgs_parse_oaicompat(req.at("messages"));
        if (req.contains("tools")) {
            in.tools = common_chat_tools_parse_oaicompat(req.at("tools"));
        }
        in.tool_choice = common_chat_tool_choice_parse_oaicompat(req.value("tool_choice", std::string("auto")));
        in.parallel_tool_calls = req.value("parallel_tool_calls", false);
        in.add_generation_prompt = req.value("add_generation_prompt", true);
        common_chat_params p = common_chat_templates_apply(tmpls.get(), in);
        json out;
        out["prompt"] = p.prompt;
        out["format"] = common_chat_format_name(p.format);
        out["grammar"] = p.grammar;
        out["grammar_lazy"] = p.grammar_lazy;
        json triggers = json::array();
        for (const auto & t : p.grammar_triggers) {
            triggers.push_back({{"type", (int) t.type}, {"value", t.value}});
        }
        out["grammar_triggers"] = triggers;
        out["preserved_tokens"] = p.preserved_tokens;
        out["additional_stops"] = p.additional_stops;
        out["generation_prompt"] = p.generation_prompt;
        json caps = json::object();
        for (const auto & [k, v] : common_chat_templates_get_caps(tmpls.get())) {
            caps[k] = v;
        }
        out["caps"] = caps;
        common_chat_parser_params syntax(p);
        if (!p.parser.empty()) {
            syntax.parser.load(p.parser);
        }
        json parsed = json::array();
        for (const auto & text : req.value("outputs", json::array())) {
            common_chat_msg m = common_chat_parse(text.get<std::string>(), false, syntax);
            json calls = json::array();
            for (const auto & c : m.tool_calls) {
                calls.push_back({{"name", c.name}, {"arguments", c.arguments}, {"id", c.id}});
            }
            parsed.push_back({{"content", m.content}, {"reasoning_content", m.reasoning_content}, {"tool_calls", calls}});
        }
        out["parsed"] = parsed;
        std::cout << out.dump() << std::endl;
    } catch (const std::exception & e) {
        std::fprintf(stderr, "%s\n", e.what());
        return 1;
    }
    llama_model_free(model);
    return 0;
}
