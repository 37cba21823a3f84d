"""Gates: verdict types, the judges (llm / expr / schema) and human decisions."""
