#include "text/chat_template.h"

#include <fstream>
#include <sstream>
#include <stdexcept>

#include "text/jinja/template.h"

namespace crl::text {

namespace {

using ojson = nlohmann::ordered_json;

// transformers' marker for continue_final_message: appended to the last message, the render is
// cut where it lands.
const char kContinueTag[] = "CONTINUE_FINAL_MESSAGE_TAG ";

[[noreturn]] void invalid(const std::string& message) { throw std::invalid_argument(message); }

// A special token: a string, the AddedToken form {"content": ...}, or null (absent).
std::optional<std::string> token_text(const ojson& config, const char* key,
                                      const std::string& origin) {
  if (!config.contains(key) || config[key].is_null()) return std::nullopt;
  const ojson& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string())
    return v["content"].get<std::string>();
  invalid(origin + ": '" + key + "' must be a string or an object with a string \"content\", got " +
          v.dump());
}

// The text of a message's content: a string, text parts joined by newlines (as vLLM does for
// templates that take string content), or "" for null.
std::string content_text(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  bool first = true;
  if (content.is_array()) {
    for (const auto& part : content) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) {
        out += (first ? "" : "\n") + part["text"].get<std::string>();
        first = false;
      }
    }
  }
  return out;
}

// Content as a template that loops over it takes it (vLLM's "openai" format): a list of parts; a
// string is one text part, null none.
ojson content_parts(const ojson& content) {
  if (content.is_array()) return content;
  ojson parts = ojson::array();
  if (content.is_string()) parts.push_back({{"type", "text"}, {"text", content}});
  return parts;
}

}  // namespace

ChatTemplate::ChatTemplate() = default;

ChatTemplate ChatTemplate::builtin(const BuiltinChatTemplate& format) {
  ChatTemplate c;
  c.builtin_ = format;
  return c;
}

ChatTemplate ChatTemplate::from_jinja(const std::string& source, const std::string& bos_token,
                                      const std::string& eos_token, const std::string& name) {
  ChatTemplate c;
  c.templates_["default"] =
      std::make_shared<const jinja::Template>(jinja::Template::parse(source, name));
  if (!bos_token.empty()) c.special_tokens_["bos_token"] = bos_token;
  if (!eos_token.empty()) c.special_tokens_["eos_token"] = eos_token;
  return c;
}

ChatTemplate ChatTemplate::from_tokenizer_config(const ojson& config, const std::string& origin) {
  if (!config.is_object())
    invalid(origin + ": expected a JSON object, got " + std::string(config.type_name()));
  ChatTemplate c;
  for (const char* key : {"bos_token", "eos_token", "unk_token", "pad_token"}) {
    if (auto t = token_text(config, key, origin)) c.special_tokens_[key] = *t;
  }
  if (!config.contains("chat_template") || config["chat_template"].is_null()) return c;
  const ojson& t = config["chat_template"];
  if (t.is_string()) {
    c.templates_["default"] = std::make_shared<const jinja::Template>(
        jinja::Template::parse(t.get<std::string>(), origin + ": chat_template"));
  } else if (t.is_array()) {
    for (size_t i = 0; i < t.size(); ++i) {
      const std::string path = origin + ": chat_template[" + std::to_string(i) + "]";
      const ojson& e = t[i];
      if (!e.is_object() || !e.contains("name") || !e["name"].is_string() ||
          !e.contains("template") || !e["template"].is_string()) {
        invalid(path + " must be an object with string \"name\" and \"template\", got " +
                e.dump().substr(0, 200));
      }
      const std::string name = e["name"].get<std::string>();
      c.templates_[name] = std::make_shared<const jinja::Template>(
          jinja::Template::parse(e["template"].get<std::string>(), path + " (" + name + ")"));
    }
    if (c.templates_.empty()) invalid(origin + ": chat_template is an empty list");
  } else {
    invalid(origin + ": chat_template must be a string or a list of {name, template}, got " +
            std::string(t.type_name()));
  }
  return c;
}

ChatTemplate ChatTemplate::from_model_dir(const std::string& dir) {
  const std::string config_path = dir + "/tokenizer_config.json";
  ojson config = ojson::object();
  std::ifstream in(config_path);
  if (in) {
    try {
      config = ojson::parse(in);
    } catch (const ojson::exception& e) {
      invalid(config_path + ": invalid JSON: " + e.what());
    }
  }
  const std::string jinja_path = dir + "/chat_template.jinja";
  std::ifstream jinja_file(jinja_path);
  if (jinja_file) {  // transformers saves the template here and prefers it to the config's
    std::stringstream text;
    text << jinja_file.rdbuf();
    if (config.is_object()) config["chat_template"] = text.str();
    return from_tokenizer_config(config, jinja_path);
  }
  return from_tokenizer_config(config, config_path);
}

std::string ChatTemplate::name() const { return is_jinja() ? "jinja" : builtin_.name(); }

const jinja::Template& ChatTemplate::select(bool has_tools) const {
  if (has_tools) {
    auto it = templates_.find("tool_use");
    if (it != templates_.end()) return *it->second;
  }
  auto it = templates_.find("default");
  if (it != templates_.end()) return *it->second;
  if (templates_.size() == 1) return *templates_.begin()->second;
  std::string names;
  for (const auto& kv : templates_) names += (names.empty() ? "" : ", ") + kv.first;
  invalid("this model has several chat templates (" + names + ") and none is named 'default'");
}

std::string ChatTemplate::render(const ojson& messages, const ChatRenderOptions& options) const {
  if (!messages.is_array()) invalid("'messages' must be a list of message objects");
  if (messages.empty()) invalid("'messages' must not be empty");
  for (const auto& m : messages) {
    if (!m.is_object() || !m.contains("role") || !m["role"].is_string()) {
      invalid("every message must be an object with a string 'role'");
    }
  }
  if (options.continue_final_message && options.add_generation_prompt) {
    invalid("'continue_final_message' and 'add_generation_prompt' cannot both be true");
  }
  if (!options.tools.is_null() && !options.tools.is_array()) invalid("'tools' must be a list");
  if (!options.kwargs.is_object()) invalid("'chat_template_kwargs' must be an object");

  if (!is_jinja()) {
    if (options.continue_final_message)
      invalid("continue_final_message needs the model's own chat template");
    std::vector<ChatMessage> plain;
    for (const auto& m : messages) {
      plain.push_back(
          {m["role"].get<std::string>(), m.contains("content") ? content_text(m["content"]) : ""});
    }
    return builtin_.render(plain, options.add_generation_prompt);
  }

  ojson msgs = messages;
  std::string final_text;
  if (options.continue_final_message) {
    ojson& last = msgs.back();
    ojson* text = nullptr;  // the final text: the content, or its last part's text
    if (last.contains("content") && last["content"].is_string()) {
      text = &last["content"];
    } else if (last.contains("content") && last["content"].is_array() && !last["content"].empty() &&
               last["content"].back().is_object() && last["content"].back().contains("text") &&
               last["content"].back()["text"].is_string()) {
      text = &last["content"].back()["text"];
    }
    if (!text) invalid("continue_final_message needs a final message whose content ends in text");
    final_text = text->get<std::string>();
    *text = final_text + kContinueTag;
  }
  // Content in the form the template takes (vLLM's "auto" content format): a list of parts for a
  // template that loops over it, else a string (text parts joined by newlines).
  const jinja::Template& tmpl = select(options.tools.is_array() && !options.tools.empty());
  for (ojson& m : msgs) {
    if (options.content_as_given) break;
    if (tmpl.iterates_message_content()) {
      m["content"] = content_parts(m.contains("content") ? m["content"] : ojson(nullptr));
    } else if (m.contains("content") && m["content"].is_array()) {
      m["content"] = content_text(m["content"]);
    }
  }
  ojson context = ojson::object();
  context["messages"] = std::move(msgs);
  context["tools"] = options.tools;
  context["documents"] = nullptr;
  context["add_generation_prompt"] = options.add_generation_prompt;
  for (auto it = special_tokens_.begin(); it != special_tokens_.end(); ++it)
    context[it.key()] = it.value();
  for (auto it = options.kwargs.begin(); it != options.kwargs.end(); ++it) {
    if (it.key() == "messages" || it.key() == "tools" || it.key() == "documents" ||
        it.key() == "add_generation_prompt") {
      invalid("'chat_template_kwargs' cannot set '" + it.key() +
              "' (it has its own request field)");
    }
    context[it.key()] = it.value();
  }
  jinja::RenderOptions render_options;
  render_options.now = options.now;
  std::string out = tmpl.render(context, render_options);
  if (options.continue_final_message) {
    const std::string tag(kContinueTag);
    const std::string bare = tag.substr(0, tag.size() - 1);
    const size_t at = out.rfind(bare);
    if (at == std::string::npos) {
      invalid(
          "continue_final_message is set but the final message does not appear in the rendered "
          "chat "
          "(the chat template drops or rewrites it)");
    }
    if (out.compare(at, tag.size(), tag) == 0) {
      out.resize(at);
    } else {  // the template trimmed the message's trailing space
      out.resize(at);
      while (!out.empty() && (out.back() == ' ' || out.back() == '\n' || out.back() == '\t' ||
                              out.back() == '\r')) {
        out.pop_back();
      }
    }
  }
  return out;
}

}  // namespace crl::text
