// Markdown to sanitised HTML: marked renders, DOMPurify removes anything that could run or load.

import { marked } from "../vendor/marked.esm.js";
import DOMPurify from "../vendor/purify.es.mjs";

marked.setOptions({ gfm: true, breaks: true });

export function renderMarkdown(text) {
  return DOMPurify.sanitize(marked.parse(String(text ?? "")), { USE_PROFILES: { html: true } });
}
