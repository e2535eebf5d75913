"""The frameworks' published recipes as data (hardware/data/recipes/, one YAML file per recipe): what each
recipe runs, where it comes from, its Strategy, and the recipe nearest a plan (compare rows, report.md)."""

from planner.recipes.apply import RecipeRun, on_job, on_own_hardware, recipe_strategy, refusal
from planner.recipes.nearest import NearestRecipe, nearest_recipe, recipe_section
from planner.recipes.schema import PublishedRecipe, load_recipes, recipes_for

__all__ = ["NearestRecipe", "PublishedRecipe", "RecipeRun", "load_recipes", "nearest_recipe", "on_job",
           "on_own_hardware", "recipe_section", "recipe_strategy", "recipes_for", "refusal"]
