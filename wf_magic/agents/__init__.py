"""Coding-agent harnesses (Claude Code, Codex, opencode, Gemini CLI) run as ``agent:`` step units."""
