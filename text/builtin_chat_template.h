// BuiltinChatTemplate: hand-written chat formats for the common checkpoint families.
//
// The fallback of text/chat_template.h for model directories that carry no template
// (their tokenizer_config.json has no chat_template): those render with kPlain. A family can be
// recognised by a pattern in a Jinja template's text (detect()) and rendered by hand (with the
// generation prompt appended):
//   ChatML (Qwen...)   "<|im_start|>"       <|im_start|>{role}\n{content}<|im_end|>\n ...
//                                           <|im_start|>assistant\n; a default system message
//                                           written in the template is used when none is given
//   Llama-3            "<|start_header_id|>" <|start_header_id|>{role}<|end_header_id|>\n\n
//                                           {content|trim}<|eot_id|> ... then the assistant header
//   Llama-2            "[INST]" + "<<SYS>>"  [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]
//                                           {assistant} </s><s>[INST] {user} [/INST]
//   Mistral            "[INST]"             [INST] {system\n\n}{user} [/INST]{assistant}</s>[INST]
//   ... plain (default, no or unrecognised template)
//                                           "{System|User|Assistant}: {content}\n" per message,
//                                           then "Assistant:"
// The BOS token is not written: the engine adds it when the model wants one. Special tokens
// written in the text (</s>, <|im_start|>, ...) are mapped to their ids by the server's encoder.
#pragma once

#include <string>
#include <vector>

namespace crl::text {

struct ChatMessage {
  std::string role;  // system, user, assistant (developer is read as system, tool as user)
  std::string content;
};

enum class ChatFormat { kPlain, kChatML, kLlama3, kLlama2, kMistral };

class BuiltinChatTemplate {
 public:
  BuiltinChatTemplate() = default;
  // Recognises the family of a Jinja chat template's text.
  static BuiltinChatTemplate detect(const std::string& jinja_template);

  ChatFormat format() const { return format_; }
  const char* name() const;
  // The prompt for `messages`, ending with the assistant's turn opened unless
  // `add_generation_prompt` is false (Llama 2 and Mistral open it with each [/INST]). Throws
  // std::invalid_argument for an empty list or an unknown role.
  std::string render(const std::vector<ChatMessage>& messages,
                     bool add_generation_prompt = true) const;

 private:
  ChatFormat format_ = ChatFormat::kPlain;
  std::string default_system_;  // ChatML: the system message the template adds when none is given
};

}  // namespace crl::text
