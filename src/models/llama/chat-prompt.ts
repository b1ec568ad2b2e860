import {
  type ChatHistoryItem,
  type ChatWrapper,
  JinjaTemplateChatWrapper,
  type LlamaModel,
  LlamaText,
  resolveChatWrapper,
  SpecialTokensText,
  type Token,
  type Tokenizer,
} from "node-llama-cpp";
import type { RenderPrompt } from "./evaluation-plan.ts";
import type { LabelTokenizer } from "./labels.ts";

/**
 * Renders a system message and a user message with the model's own chat template, up to the
 * assistant's answer position, and tokenizes the result with the model's tokenizer.
 *
 * The template is the model's jinja `tokenizer.chat_template`, rendered by node-llama-cpp's
 * `JinjaTemplateChatWrapper` (thinking disabled: `enable_thinking: false`); a model without one (or
 * with one that cannot be rendered) gets the wrapper node-llama-cpp resolves for it. Message texts
 * are tokenized as plain text (never parsed for special tokens), the template's own markup with its
 * special tokens. The BOS token is prepended when the model expects one (`tokenize()` does not).
 */
export class ChatPrompt {
  readonly wrapperName: string;
  private readonly wrapper: ChatWrapper;
  private readonly bos: Token | null;

  constructor(
    private readonly model: LlamaModel,
    warn: (message: string) => void = () => {},
  ) {
    this.wrapper = pickChatWrapper(model, warn);
    this.wrapperName = this.wrapper.wrapperName;
    this.bos = model.tokens.shouldPrependBosToken ? model.tokens.bos : null;
  }

  /** The rendered prompt (ending at the answer position) as node-llama-cpp text with special tokens. */
  text(systemText: string, userText: string): LlamaText {
    const chatHistory: ChatHistoryItem[] = [
      { type: "system", text: systemText },
      { type: "user", text: userText },
      { type: "model", response: [] },
    ];
    return this.wrapper.generateContextState({ chatHistory }).contextText;
  }

  /** Tokens of a rendered prompt, BOS first when the model expects it. */
  tokens(text: LlamaText, tokenizer: Tokenizer): Token[] {
    const tokens = text.tokenize(tokenizer);
    if (this.bos !== null && tokens[0] !== this.bos) tokens.unshift(this.bos);
    return tokens;
  }

  /**
   * The tokens a label adds at the answer position of `text`: tokenize prompt + label (the label joined
   * to the prompt's last piece, as one text would be) and drop the prompt's tokens. When joining
   * changes the prompt's own last tokens (a template that ends in a space, which SentencePiece would
   * merge into the label), the label is tokenized as the next piece instead: the tokens that spell it
   * right after the prompt's tokens. Null when neither keeps the prompt's tokens or the tokens do not
   * decode back to the label.
   */
  labelTokenizer(text: LlamaText, tokenizer: Tokenizer): LabelTokenizer {
    const prompt = this.tokens(text, tokenizer);
    const cache = new Map<string, readonly number[] | null>();
    const after = (full: Token[], label: string): Token[] | null => {
      if (full.length <= prompt.length || !prompt.every((t, i) => full[i] === t)) return null;
      const extra = full.slice(prompt.length);
      return this.model.detokenize(extra, false).trim() === label ? extra : null;
    };
    return (label: string) => {
      const hit = cache.get(label);
      if (hit !== undefined) return hit;
      const result =
        after(this.tokens(appendToLastPiece(text, label), tokenizer), label) ??
        after(this.tokens(LlamaText([...text.values, label]), tokenizer), label);
      cache.set(label, result);
      return result;
    };
  }
}

/**
 * What a label appended to the prompt is tokenized together with: the prompt's last piece (the
 * template's closing special-token text, or the trailing plain text). node-llama-cpp tokenizes a
 * prompt piece by piece, so two prompts with the same last piece give a label the same tokens.
 */
export function lastPieceKey(text: LlamaText): string {
  const values = text.values;
  const last = values[values.length - 1];
  if (last instanceof SpecialTokensText) return `special:${last.value}`;
  if (typeof last === "string") {
    let tail = "";
    for (let i = values.length - 1; i >= 0 && typeof values[i] === "string"; i--) tail = (values[i] as string) + tail;
    return `text:${values.length}:${tail}`;
  }
  return `token:${String(last)}`;
}

/** The prompt text with `label` appended to its last piece, so both are tokenized together. */
function appendToLastPiece(text: LlamaText, label: string): LlamaText {
  const values = text.values;
  const last = values[values.length - 1];
  if (last instanceof SpecialTokensText) {
    return LlamaText([...values.slice(0, -1), new SpecialTokensText(last.value + label)]);
  }
  return LlamaText([...values, label]);
}

function pickChatWrapper(model: LlamaModel, warn: (message: string) => void): ChatWrapper {
  const template = model.fileInfo.metadata?.tokenizer?.chat_template;
  if (typeof template === "string" && template.trim() !== "") {
    try {
      return new JinjaTemplateChatWrapper({
        template,
        tokenizer: model.tokenizer,
        reasoning: false,
        additionalRenderParameters: { enable_thinking: false },
      });
    } catch (err) {
      warn(
        `the model's chat template cannot be used (${err instanceof Error ? err.message : String(err)}); using node-llama-cpp's resolved chat wrapper`,
      );
    }
  } else {
    warn("the model has no chat template; using node-llama-cpp's resolved chat wrapper");
  }
  return resolveChatWrapper(model);
}

/**
 * A tokenizer that remembers its results for the life of one request: the state's text is
 * tokenized once, however many questions and labels are rendered around it.
 */
export function memoTokenizer(model: LlamaModel): Tokenizer {
  // One map per tokenizer mode, keyed by the text itself (no concatenated keys: a long state's
  // string hash is computed once per string, not once per lookup).
  const memo = new Map<string, Map<string, Token[]>>();
  const tokenize = (text: string, specialTokens?: boolean | "builtin", options?: "trimLeadingSpace"): Token[] => {
    const mode = `${specialTokens === "builtin" ? "b" : specialTokens ? "s" : "t"}${options ? "1" : "0"}`;
    let byText = memo.get(mode);
    if (!byText) {
      byText = new Map();
      memo.set(mode, byText);
    }
    let tokens = byText.get(text);
    if (tokens === undefined) {
      tokens =
        specialTokens === "builtin"
          ? model.tokenize(text as Parameters<LlamaModel["tokenize"]>[0] & "BOS", "builtin")
          : model.tokenize(text, specialTokens, options);
      byText.set(text, tokens);
    }
    return tokens.slice();
  };
  return Object.assign(tokenize, { detokenize: model.tokenizer.detokenize }) as Tokenizer;
}

/**
 * The planner's view of one call's prompts (see `planCall`): each rendered with `prompt`, tokenized by one
 * memoising tokenizer for the whole call.
 */
export function callPrompts(prompt: ChatPrompt, model: LlamaModel): RenderPrompt<Token> {
  const tokenizer = memoTokenizer(model);
  return (systemText, userText) => {
    const text = prompt.text(systemText, userText);
    return {
      tokens: () => prompt.tokens(text, tokenizer),
      tailKey: () => lastPieceKey(text),
      labelTokenizer: () => prompt.labelTokenizer(text, tokenizer),
    };
  };
}
