#include "text/builtin_chat_template.h"

#include <cctype>
#include <stdexcept>

namespace crl::text {

namespace {

std::string trim(const std::string& s) {
  const char* ws = " \t\r\n";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// The role as the templates name it.
std::string normalise_role(const std::string& role) {
  if (role == "system" || role == "developer") return "system";
  if (role == "user" || role == "tool") return "user";
  if (role == "assistant") return "assistant";
  throw std::invalid_argument("unknown message role '" + role +
                              "' (expected system, developer, user, assistant or tool)");
}

std::string capitalised(const std::string& role) {
  std::string r = role;
  if (!r.empty()) r[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(r[0])));
  return r;
}

}  // namespace

BuiltinChatTemplate BuiltinChatTemplate::detect(const std::string& t) {
  BuiltinChatTemplate c;
  if (t.find("<|im_start|>") != std::string::npos) {
    c.format_ = ChatFormat::kChatML;
    // A literal default system turn, e.g. "<|im_start|>system\nYou are a helpful
    // assistant.<|im_end|>".
    const std::string open = "<|im_start|>system\n";
    for (size_t at = t.find(open); at != std::string::npos; at = t.find(open, at + 1)) {
      const size_t begin = at + open.size();
      const size_t end = t.find("<|im_end|>", begin);
      if (end == std::string::npos) break;
      const std::string text = t.substr(begin, end - begin);
      if (!text.empty() && text.find('{') == std::string::npos) {
        c.default_system_ = text;
        break;
      }
    }
  } else if (t.find("<|start_header_id|>") != std::string::npos) {
    c.format_ = ChatFormat::kLlama3;
  } else if (t.find("[INST]") != std::string::npos) {
    c.format_ = t.find("<<SYS>>") != std::string::npos ? ChatFormat::kLlama2 : ChatFormat::kMistral;
  }
  return c;
}

const char* BuiltinChatTemplate::name() const {
  switch (format_) {
    case ChatFormat::kChatML:
      return "chatml";
    case ChatFormat::kLlama3:
      return "llama3";
    case ChatFormat::kLlama2:
      return "llama2";
    case ChatFormat::kMistral:
      return "mistral";
    case ChatFormat::kPlain:
      break;
  }
  return "plain";
}

std::string BuiltinChatTemplate::render(const std::vector<ChatMessage>& input,
                                        bool add_generation_prompt) const {
  if (input.empty()) throw std::invalid_argument("'messages' must not be empty");
  std::vector<ChatMessage> messages;
  for (const auto& m : input) messages.push_back({normalise_role(m.role), m.content});
  std::string out;
  switch (format_) {
    case ChatFormat::kChatML: {
      if (messages[0].role != "system" && !default_system_.empty()) {
        out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      }
      for (const auto& m : messages)
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    }
    case ChatFormat::kLlama3: {
      for (const auto& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) +
               "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    }
    case ChatFormat::kLlama2:
    case ChatFormat::kMistral: {
      std::string system;
      size_t first = 0;
      if (messages[0].role == "system") {
        system = messages[0].content;
        first = 1;
      }
      bool first_user = true;
      for (size_t i = first; i < messages.size(); ++i) {
        const auto& m = messages[i];
        if (m.role == "system") {
          throw std::invalid_argument("this chat template takes a system message only first");
        }
        if (m.role == "user") {
          std::string content = trim(m.content);
          if (first_user && !system.empty()) {
            content = format_ == ChatFormat::kLlama2
                          ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content
                          : system + "\n\n" + content;
          }
          if (!first_user) out += format_ == ChatFormat::kLlama2 ? "<s>" : "";
          out += "[INST] " + content + " [/INST]";
          first_user = false;
        } else {
          out += (format_ == ChatFormat::kLlama2 ? " " : "") + trim(m.content) +
                 (format_ == ChatFormat::kLlama2 ? " </s>" : "</s>");
        }
      }
      return out;
    }
    case ChatFormat::kPlain:
      break;
  }
  for (const auto& m : messages) out += capitalised(m.role) + ": " + m.content + "\n";
  if (add_generation_prompt) out += "Assistant:";
  return out;
}

}  // namespace crl::text
