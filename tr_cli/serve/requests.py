"""A validated request becomes a decode job: the prompt's tokens (chat messages through the
model's chat template, the same encoder `tr chat` uses), the reply's token budget inside the
model's context, and the sampling settings (the request's over the server's defaults, merged with
the model's generation config exactly as `tr chat` merges them)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path

from ..core.errors import SettingError
from ..core.sampling_config import SamplingConfig, SamplingRequest
from ..core.stopping import NoRoomForReply, reply_budget
from ..engine.options import DEFAULT_MAX_NEW_TOKENS
from ..text.conversation import ConversationEncoder, TemplateError
from ..text.grammar import Grammar, GrammarCompiler, GrammarConstraint, GrammarError
from ..text.prompt_bound import fewest_tokens, longest_token_chars
from ..text.schema_defaults import AS_WRITTEN, STRICT, SchemaReading
from ..text.tools import Tool, ToolChoice, ToolFormat, parameter_grammars, tool_format
from .errors import ApiError
from .schema import ChatCompletionRequest, CompletionRequest, GenerationRequest
from .worker import Job


def model_aliases(argument: str, path: Path | None, general_name: str | None = None) -> frozenset[str]:
    """The names a request may give for the model beside its id: the MODEL argument as given, the
    path the server was started with (as given and resolved), the file or directory name with and
    without its extension, and a GGUF's `general.name`."""
    names = {argument, general_name}
    if path is not None:
        names |= {str(path), str(path.resolve()), path.name, path.stem}
    return frozenset(name for name in names if name)


@dataclass
class ServedModel:
    """What the HTTP side knows of the model: its names, tokenizer and limits."""

    name: str  # the id /v1/models lists and responses carry
    aliases: frozenset[str]  # other names a request may use (the MODEL argument as given)
    tokenizer: object
    generation_config: object | None
    context_length: int | None
    max_depth: int  # how far past the cache a step's drafts reach
    vocab_size: int  # the model's output rows (structured output masks them all)
    stop_ids: tuple[int, ...]  # the tokens that end a reply (a grammar allows them at its end)
    default_max_tokens: int = DEFAULT_MAX_NEW_TOKENS
    default_sampling: SamplingRequest = field(default_factory=SamplingRequest)
    schema_reading: SchemaReading = STRICT  # what schemas leave unsaid, unless a request says (open_schemas)

    def __post_init__(self) -> None:
        self.encoder = ConversationEncoder(self.tokenizer)

    @cached_property
    def grammars(self) -> GrammarCompiler:
        """Built on the first structured request (~0.5 s), then kept."""
        return GrammarCompiler(self.tokenizer, self.vocab_size, self.stop_ids)

    @cached_property
    def tool_format(self) -> ToolFormat:
        """How this model's chat template speaks tools (text/tools.py)."""
        added = self.tokenizer.get_added_vocab() if hasattr(self.tokenizer, "get_added_vocab") else {}
        return tool_format(getattr(self.tokenizer, "chat_template", None), added)

    def constraint(self, grammar: Grammar | None, param: str) -> GrammarConstraint | None:
        """The reply's grammar in its initial state, checked against the tokenizer; None for text."""
        if grammar is None:
            return None
        try:
            return self.grammars.constraint(grammar)
        except GrammarError as exc:
            raise ApiError(400, str(exc), param=param) from None

    def reading(self, request: GenerationRequest) -> SchemaReading:
        """How the request's schemas are read: as it asks (open_schemas), else the server's way."""
        if request.open_schemas is None:
            return self.schema_reading
        return AS_WRITTEN if request.open_schemas else STRICT

    def tool_grammar(self, tools: list[Tool], choice: ToolChoice, answer: dict | None = None) -> Grammar | None:
        """The grammar the reply follows for the tools offered (None: free text), each tool's
        parameter schema checked first so that an error names the tool; `answer`: the schema of
        a reply that calls nothing (response_format), when there is one."""
        try:
            parameter_grammars(tools)  # each tool's schema on its own: an error names the tool
            return self.tool_format.grammar(tools, choice, answer)
        except GrammarError as exc:
            raise ApiError(400, str(exc), param="tools") from None

    @cached_property
    def longest_token(self) -> int:
        return longest_token_chars(self.tokenizer)

    def _refuse_what_cannot_fit(self, texts: list[str], param: str) -> None:
        """Before templating and tokenizing (seconds for megabytes of text): refuse texts too
        long for the context whatever their tokens turn out to be."""
        if self.context_length is None:
            return
        fewest = fewest_tokens(texts, self.longest_token)
        if fewest >= self.context_length:
            characters = sum(len(text) for text in texts)
            raise ApiError(
                400,
                f"This model's maximum context length is {self.context_length} tokens; the {param} hold "
                f"{characters:,} characters, at least {fewest:,} tokens. Shorten the {param}.",
                param=param,
                code="context_length_exceeded",
            )

    def check_name(self, requested: str) -> None:
        if requested != self.name and requested not in self.aliases:
            raise ApiError(
                404,
                f"The model '{requested}' does not exist; this server runs '{self.name}'",
                param="model",
                code="model_not_found",
            )

    def chat_prompt(self, request: ChatCompletionRequest) -> list[int]:
        messages = request.conversation()
        if not self.encoder.templated:
            raise ApiError(400, f"model {self.name} has no chat template: use /v1/completions", param="messages")
        self._refuse_what_cannot_fit([m["content"] for m in messages], "messages")
        template_tools = None
        if request.uses_tools():
            tools, choice = request.tool_setup() or ([], ToolChoice("none"))
            messages = self.tool_format.prepare(messages, tools, choice)
            if self.tool_format.native and choice.offers:
                template_tools = [tool.as_template() for tool in tools]
        try:
            return self.encoder.encode(messages, template_tools).ids
        except TemplateError as exc:
            raise ApiError(400, str(exc), param="messages") from None

    def completion_prompt(self, request: CompletionRequest) -> list[int]:
        prompt = request.prompt_text_or_ids()
        if isinstance(prompt, str):
            if not prompt:
                raise ApiError(400, "prompt is empty", param="prompt")
            self._refuse_what_cannot_fit([prompt], "prompt")
            return list(self.tokenizer.encode(prompt, add_special_tokens=True))
        vocabulary = len(self.tokenizer)
        if any(not 0 <= t < vocabulary for t in prompt):
            raise ApiError(400, f"prompt: token ids must be in 0..{vocabulary - 1}", param="prompt")
        return list(prompt)

    def budget(self, prompt: list[int], requested: int | None) -> int:
        """New tokens allowed: what was asked (else the server's default), clamped to the room the
        context leaves; a prompt that leaves none is refused with the counts."""
        wanted = requested if requested is not None else self.default_max_tokens
        try:
            return reply_budget(wanted, self.context_length, 0, len(prompt), self.max_depth)
        except NoRoomForReply:
            raise ApiError(
                400,
                f"This model's maximum context length is {self.context_length} tokens; the prompt has "
                f"{len(prompt)} tokens, which leaves no room for a reply (drafting needs {self.max_depth} "
                "positions past it). Shorten the messages.",
                param="messages",
                code="context_length_exceeded",
            ) from None

    def sampling(self, request: GenerationRequest) -> SamplingConfig:
        base = self.default_sampling

        def pick(name: str):
            given = getattr(request, name)
            return given if given is not None else getattr(base, name)

        try:
            merged = SamplingRequest(
                temperature=pick("temperature"),
                top_p=pick("top_p"),
                top_k=pick("top_k"),
                repetition_penalty=pick("repetition_penalty"),
                seed=pick("seed"),
            )
            return merged.resolve(self.generation_config)
        except SettingError as exc:  # the request's field, or the model's generation config
            field_given = getattr(request, exc.setting, None) is not None
            raise ApiError(
                400, f"{exc.setting} {exc.reason}, got {exc.value}", param=exc.setting if field_given else None
            ) from None

    def job(
        self, request: ChatCompletionRequest | CompletionRequest, loop: asyncio.AbstractEventLoop | None = None
    ) -> Job:
        """Everything checked before the job queues (an error here costs no decode time). Off the
        event loop, give the `loop` the job reports to."""
        self.check_name(request.model)
        request.unsupported()
        stops = request.stop_strings()
        if isinstance(request, ChatCompletionRequest):
            prompt = self.chat_prompt(request)
        else:
            prompt = self.completion_prompt(request)
        budget = self.budget(prompt, request.requested_tokens())
        read_calls = None
        setup = request.tool_setup() if isinstance(request, ChatCompletionRequest) else None
        reading = self.reading(request)
        if setup is not None and setup[1].offers:
            tools, choice = [replace(tool, reading=reading) for tool in setup[0]], setup[1]
            answer = request.response_format.answer_schema(reading) if request.response_format else None
            grammar, param = self.tool_grammar(tools, choice, answer), "tools"

            def read_calls(text: str, whole: bool) -> tuple:
                return (self.tool_format.parse if whole else self.tool_format.parse_cut)(text, tools)

        else:
            grammar, param = request.grammar(reading), "response_format"
        constraint = self.constraint(grammar, param)
        return Job(
            prompt,
            budget,
            self.sampling(request),
            stops,
            logprobs=request.logprob_top(),
            constraint=constraint,
            read_calls=read_calls,
            steps=request.wants_steps(),
            loop=loop,
        )
