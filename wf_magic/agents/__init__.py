"""Coding-agent harnesses (Claude Code, Codex, opencode, Gemini CLI) as ``agent:`` step units."""
